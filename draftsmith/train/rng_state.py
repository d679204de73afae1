"""The random number generators' states of one process, saved as safetensors (never a pickle), so
that a resumed run draws the same noise and dropout as an uninterrupted one."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

from draftsmith.errors import DraftsmithError


def rng_state_file(folder: Path, process_index: int) -> Path:
    """Where process `process_index` keeps its generators' states in a checkpoint folder."""
    return folder / f"rng_state_{process_index}.safetensors"


def save_rng_state(path: Path) -> None:
    """Write the states of Python's, NumPy's, torch's CPU and (when present) CUDA generators."""
    from safetensors.torch import save_file

    version, python_state, gauss_next = random.getstate()
    _, numpy_keys, numpy_pos, has_gauss, cached_gaussian = np.random.get_state()
    tensors = {"python": torch.tensor(python_state, dtype=torch.int64),
               "numpy": torch.from_numpy(numpy_keys.astype(np.int64)),
               "torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{index}"] = state
    scalars = {"python_version": version, "python_gauss_next": gauss_next,
               "numpy_pos": int(numpy_pos), "numpy_has_gauss": int(has_gauss),
               "numpy_cached_gaussian": float(cached_gaussian)}
    save_file(tensors, str(path), metadata={"scalars": json.dumps(scalars)})


def load_rng_state(path: Path) -> None:
    """Restore what `save_rng_state` wrote (CUDA states for the devices this process sees).

    Raises:
        DraftsmithError: the file is missing, damaged or not written by `save_rng_state`.
    """
    from safetensors import SafetensorError, safe_open

    fix = (f"the checkpoint is incomplete or damaged: delete {path.parent} to resume from an "
           f"earlier checkpoint, or delete {path.parent.parent} to start the run over")
    if not path.is_file():
        raise DraftsmithError(f"{path} is missing; {fix}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
            scalars = json.loads((handle.metadata() or {}).get("scalars", "null"))
        random.setstate((int(scalars["python_version"]),
                         tuple(int(v) for v in tensors["python"].tolist()),
                         scalars["python_gauss_next"]))
        np.random.set_state(("MT19937", tensors["numpy"].numpy().astype(np.uint32),
                             int(scalars["numpy_pos"]), int(scalars["numpy_has_gauss"]),
                             float(scalars["numpy_cached_gaussian"])))
        torch.set_rng_state(tensors["torch_cpu"])
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
        raise DraftsmithError(f"{path} does not hold random generator states ({err}); "
                              f"{fix}") from None
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            if f"torch_cuda_{index}" in tensors:
                torch.cuda.set_rng_state(tensors[f"torch_cuda_{index}"], index)
