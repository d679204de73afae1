"""The docs site builds with `mkdocs build --strict` (issue 56): every page in mkdocs.yml's nav
exists, every link between pages resolves, and no page is left out of the nav."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: it comes with the dev extra "
                        "(pip install -e '.[dev]', as scripts/setup.sh does)")
    pytest.importorskip("material", reason="mkdocs-material is not installed: it comes with the "
                        "dev extra (pip install -e '.[dev]', as scripts/setup.sh does)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material's end-of-life banner
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                             str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    for page in ("index.html", "training-gpus/index.html", "kinds/eagle3/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
