"""The wheel as a user installs it: built from the package's files, installed into a fresh virtual
environment outside the clone, and run from a folder that holds no recipes/. `draftsmith --help`,
`draftsmith recipes` and `draftsmith plan llama-3.1-8b/eagle3` must work from the wheel alone
(the recipes ship inside it as draftsmith/recipes/).

The new environment reuses this one's installed dependencies through a .pth line (torch and the
rest are not reinstalled); that path adds no .pth files of its own, so this clone's editable
install is not seen there and `draftsmith` is imported from the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FILES = ("pyproject.toml", "setup.py", "README.md", "draftsmith", "recipes")

pytestmark = pytest.mark.slow


def _run(args: list, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict]:
    """(the fresh environment's bin folder, the environment to run it with)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy, so the build writes no build/ or egg-info into the clone
    src.mkdir()
    for name in PACKAGE_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # build isolation: pyproject.toml's setuptools>=77, not the older one a fresh venv may hold
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp / "dist", src], tmp,
         env)
    wheel = next((tmp / "dist").glob("draftsmith-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp, env)
    site = Path(_run([venv / "bin" / "python", "-c", "import sysconfig; "
                      "print(sysconfig.get_paths()['purelib'])"], tmp, env).stdout.strip())
    (site / "reuse_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "-q", wheel], tmp, env)
    print(f"installed {wheel.name} into {venv}")
    return venv / "bin", env


def test_the_wheel_holds_the_recipes(installed, tmp_path):
    bin_dir, env = installed
    where = _run([bin_dir / "python", "-c", "import draftsmith.recipes_index as r; "
                  "print(r.__file__); print(r.recipes_root())"], tmp_path, env).stdout.split()
    assert str(ROOT) not in where[0], f"draftsmith was imported from the clone: {where[0]}"
    assert where[1] == str(Path(where[0]).parent / "recipes")


def test_help_recipes_and_plan_run_outside_the_clone(installed, tmp_path):
    bin_dir, env = installed
    assert not (tmp_path / "recipes").exists()
    helped = _run([bin_dir / "draftsmith", "--help"], tmp_path, env)
    assert "recipes" in helped.stdout and "plan" in helped.stdout
    listed = _run([bin_dir / "draftsmith", "recipes"], tmp_path, env)
    assert "llama-3.1-8b/eagle3" in listed.stdout.split()
    planned = _run([bin_dir / "draftsmith", "plan", "llama-3.1-8b/eagle3", "--gpu", "h100-80gb"],
                   tmp_path, env)
    assert "FITS" in planned.stdout or "fits" in planned.stdout
    for result in (helped, listed, planned):
        print(f"$ draftsmith {' '.join(result.args[1:])}\n{result.stdout[-1500:]}")
