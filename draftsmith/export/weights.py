"""Reading and writing the tensors of exported drafters: safetensors only, pickle refused.

Published drafters sometimes ship `pytorch_model.bin` / `*.pt` files. Unpickling runs code from the
file, so they are refused unless the caller opts in (`allow_pickle=True`), and even then they are
read with `torch.load(weights_only=True)`, which only rebuilds tensors and plain containers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


def weight_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """(safetensors files, pickle files) directly inside `folder`, sorted by name."""
    safe = sorted(folder.glob("*.safetensors"))
    pickles = sorted(p for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    return safe, pickles


def read_weights(folder: str | Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of the weight files directly in `folder` (several shards are merged).

    Raises:
        DraftsmithError: no weights; only pickle files and `allow_pickle` is False; a name that
            appears in two files; a damaged safetensors file; a pickle file that holds something
            other than tensors.
    """
    folder = Path(folder)
    safe, pickles = weight_files(folder)
    if not safe and not pickles:
        raise DraftsmithError(f"{folder} holds no weights (*.safetensors, or pickle *.bin/*.pt)")
    if not safe and not allow_pickle:
        names = ", ".join(p.name for p in pickles)
        raise DraftsmithError(
            f"{folder} only has pickle checkpoint(s) ({names}); loading a pickle can run arbitrary "
            "code, so draftsmith refuses it. Convert it to safetensors (e.g. with safetensors' "
            "save_file after torch.load(weights_only=True)); for a file you trust, `draftsmith "
            "export --check` takes --allow-pickle and the library allow_pickle=True (tensors only, "
            "weights-only loader)")
    tensors: dict[str, torch.Tensor] = {}
    for path in safe or pickles:
        part = _load_safetensors(path) if path.suffix == ".safetensors" else _load_pickle(path)
        clash = sorted(set(part) & set(tensors))
        if clash:
            raise DraftsmithError(f"{path} repeats tensor(s) {clash[:3]} found in another file of "
                                  f"{folder}")
        tensors.update(part)
    return tensors


def tensor_names(folder: Path) -> set[str]:
    """The tensor names of the weight files directly in `folder`, read from the safetensors
    headers only (pickle files are read whole, under `read_weights`' rules).

    Raises:
        DraftsmithError: as `read_weights`.
    """
    from safetensors import safe_open

    safe, _ = weight_files(folder)
    if not safe:
        return set(read_weights(folder))
    names: set[str] = set()
    for path in safe:
        with safe_open(path, "pt") as weights:
            names |= set(weights.keys())
    return names


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError) as err:
        raise DraftsmithError(f"{path} is damaged (truncated or not safetensors: {err}); download "
                              "or export it again") from err


def _load_pickle(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, ... for unsafe content
        raise DraftsmithError(f"{path} could not be read as plain tensors ({_reason(err)}); only "
                              "state dicts of tensors are accepted: convert it to safetensors "
                              "where you trust it") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DraftsmithError(f"{path} is not a state dict of tensors")
    return state


def _reason(err: Exception) -> str:
    """One line of why torch's weights-only unpickler refused a file (its message spans many
    lines and suggests `weights_only=False`, which draftsmith never does)."""
    text = str(err)
    _, marker, rest = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (rest if marker else text).splitlines() if line.strip()]
    return (lines[0] if lines else type(err).__name__)[:200]


def write_weights(tensors: dict[str, torch.Tensor], path: Path) -> Path:
    """Save contiguous CPU tensors as safetensors (the `format: pt` header transformers expects);
    a tensor stored under several names (MTP's per-layer embedding copies) is written each time."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    ready = {}
    for name, value in tensors.items():
        value = value.detach().to("cpu").contiguous()
        if value.untyped_storage().data_ptr() in seen:
            value = value.clone()
        seen.add(value.untyped_storage().data_ptr())
        ready[name] = value
    save_file(ready, path, metadata={"format": "pt"})
    return path


def read_json(path: Path) -> dict:
    """A JSON object from `path`.

    Raises:
        DraftsmithError: missing file or invalid JSON.
    """
    if not path.is_file():
        raise DraftsmithError(f"{path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DraftsmithError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise DraftsmithError(f"{path} does not hold a JSON object")
    return data
