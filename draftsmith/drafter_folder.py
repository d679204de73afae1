"""The drafter folder `draftsmith train` writes and everything else reads: `model.safetensors`
(the drafter's tensors), `draftsmith_drafter.json` (kind, settings, the target it was trained
for, the aux layer ids it reads, training facts) and, for Medusa-2, the LoRA adapter in `lora/`.
This module is its one owner: writing it atomically, reading and validating it, checking it
against a target and rebuilding the drafter module from it."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from draftsmith.errors import DraftsmithError

DRAFTER_CONFIG = "draftsmith_drafter.json"
WEIGHTS = "model.safetensors"


@dataclass
class LoadedDrafter:
    """A drafter module ready for decoding, its kind and the metadata it was saved with."""

    kind: str
    module: nn.Module
    meta: dict


# Target config fields every drafter is built from; a record without them cannot be checked.
TARGET_KEYS = ("hidden_size", "vocab_size", "num_hidden_layers")


def write_drafter_folder(final: Path, tensors: dict, meta: dict, lora_target=None) -> Path:
    """Write a drafter folder atomically (a temporary folder renamed into place).

    Args:
        final: the folder to create (replaced when it exists).
        tensors: the drafter's state dict (CPU, contiguous).
        meta: what `draftsmith_drafter.json` records (see `read_drafter_meta`).
        lora_target: a peft-wrapped target whose adapter is saved to `lora/` (Medusa-2).
    """
    from safetensors.torch import save_file

    check_finite(tensors, f"refusing to save the drafter to {final}", "training diverged (lower "
                 "train.lr, or check the data); nothing was written")
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, tmp / WEIGHTS, metadata={"format": "pt"})
    if lora_target is not None:
        lora_target.save_pretrained(tmp / "lora", safe_serialization=True)
    (tmp / DRAFTER_CONFIG).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.replace(final)
    return final


def read_drafter_meta(folder: str | Path) -> dict:
    """The validated `draftsmith_drafter.json` of a drafter folder written by `draftsmith train`.

    Raises:
        DraftsmithError: the folder does not exist, the file is missing or not JSON, or a field
            (`kind`, `drafter_config`, `target_config` and its sizes, `aux_layers`) is missing or
            malformed. Each message names the folder, the problem and the fix.
    """
    from draftsmith.registry import get_spec

    folder = Path(folder)
    if not folder.exists():
        raise DraftsmithError(f"drafter folder {folder} does not exist; pass OUTPUT_DIR/drafter "
                              "written by `draftsmith train` (or an export folder)")
    if not folder.is_dir():
        raise DraftsmithError(f"{folder} is a file, not a drafter folder; pass the folder that "
                              f"holds {DRAFTER_CONFIG} and {WEIGHTS}")
    path = folder / DRAFTER_CONFIG
    if not path.is_file():
        pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        hint = f" (found pickle files {pickles}: draftsmith only loads safetensors)" if pickles else ""
        raise DraftsmithError(f"{folder} is not a draftsmith drafter: {DRAFTER_CONFIG} is missing"
                              f"{hint}")
    fix = "the training output is damaged; restore it or train again"
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DraftsmithError(f"{path} is not valid JSON ({err}); {fix}") from err
    if not isinstance(meta, dict):
        raise DraftsmithError(f"{path} does not hold a JSON object; {fix}")
    for key, kind in (("kind", str), ("drafter_config", dict), ("target_config", dict)):
        if not isinstance(meta.get(key), kind):
            problem = "lacks" if key not in meta else f"has a malformed ({type(meta[key]).__name__})"
            raise DraftsmithError(f"{path} {problem} field {key!r} ({kind.__name__} expected); {fix}")
    get_spec(meta["kind"])
    trained = meta["target_config"]
    bad = [k for k in TARGET_KEYS if not isinstance(trained.get(k), int) or trained[k] < 1]
    if bad:
        raise DraftsmithError(f"{path}: target_config lacks positive integer {bad}, so the drafter "
                              f"cannot be checked against a target; {fix}")
    aux = meta.get("aux_layers", [])
    if not isinstance(aux, list) or not all(isinstance(i, int) for i in aux):
        raise DraftsmithError(f"{path}: aux_layers {aux!r} is not a list of layer ids; {fix}")
    return meta


def read_drafter_weights(folder: str | Path) -> dict:
    """The tensors of `folder/model.safetensors`.

    Raises:
        DraftsmithError: the file is missing, truncated or not safetensors.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(folder) / WEIGHTS
    if not path.is_file():
        raise DraftsmithError(f"{path} is missing; the drafter folder is incomplete (restore it or "
                              "train again)")
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError) as err:
        raise DraftsmithError(f"{path} is damaged (truncated or not safetensors: {err}); restore "
                              "it or train again") from err
    check_finite(tensors, str(path), "the training that wrote it diverged: train again with a "
                 "lower train.lr (draftsmith train now stops at the first non-finite loss)")
    return tensors


def non_finite_tensors(tensors: dict) -> list[str]:
    """Names of the floating-point tensors that hold a NaN or an infinity."""
    import torch

    return [name for name, value in tensors.items()
            if value.is_floating_point() and not bool(torch.isfinite(value).all())]


def check_finite(tensors: dict, where: str, fix: str) -> None:
    """Refuse drafter weights with NaN or infinite values: decoding with them proposes garbage
    (verification keeps the output right, but every draft is wasted) and an engine serves them
    without a word.

    Raises:
        DraftsmithError: naming `where`, up to three of the tensors and `fix`.
    """
    bad = non_finite_tensors(tensors)
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise DraftsmithError(f"{where}: tensor(s) {', '.join(bad[:3])}{more} hold NaN or "
                              f"infinite values; {fix}")


def check_drafter_fits_target(meta: dict, target_config) -> None:
    """Hidden size, vocab size and layer count recorded at training must match the target.

    Raises:
        DraftsmithError: naming the field and both values.
    """
    trained = meta["target_config"]
    for key in TARGET_KEYS:
        if trained[key] != getattr(target_config, key, None):
            raise DraftsmithError(
                f"drafter was trained for a target with {key}={trained[key]} but this target has "
                f"{key}={getattr(target_config, key, None)} ({meta.get('target', '?')} vs the "
                "target given); evaluate it with the target it was trained on")


def load_drafter(folder: str | Path, target: nn.Module) -> LoadedDrafter:
    """Rebuild the drafter of `folder` for `target` and load its weights (safetensors only).

    EAGLE-3 drafters are rebuilt with the aux layers recorded at training (`aux_layers`), so a
    change of the default never changes what a saved drafter reads.

    Raises:
        DraftsmithError: missing or damaged files, malformed metadata, a pickle checkpoint,
            tensors that do not fit the drafter, or a mismatch with the target.
    """
    from draftsmith.registry import get_spec

    folder = Path(folder)
    meta = read_drafter_meta(folder)
    check_drafter_fits_target(meta, target.config)
    spec = get_spec(meta["kind"])
    settings = dict(meta["drafter_config"])
    if meta.get("aux_layers") and "layer_ids" in settings and not settings["layer_ids"]:
        settings["layer_ids"] = meta["aux_layers"]
    module = spec.build(target.config, spec.make_config(settings))
    state = read_drafter_weights(folder)
    expected = module.state_dict()
    missing = [k for k in expected if k not in state and not k.startswith("rotary.")]
    unexpected = [k for k in state if k not in expected]
    if unexpected or any(not k.startswith(spec.frozen_prefixes) for k in missing):
        raise DraftsmithError(f"{folder / WEIGHTS} does not fit a {meta['kind']} drafter: "
                              f"missing {missing[:5]}, unexpected {unexpected[:5]}; restore it or "
                              "train again")
    wrong = [f"{k} {list(v.shape)} (needs {list(expected[k].shape)})" for k, v in state.items()
             if tuple(v.shape) != tuple(expected[k].shape)]
    if wrong:
        raise DraftsmithError(f"{folder / WEIGHTS} does not fit the {meta['kind']} drafter its "
                              f"{DRAFTER_CONFIG} describes: {', '.join(wrong[:3])}; the two files "
                              "are from different runs or damaged (restore them or train again)")
    module.load_state_dict(state, strict=False)
    if missing:  # frozen copies of the target's embedding / head were not saved
        module.init_from_target(target)
        module.load_state_dict(state, strict=False)
    param = next(target.parameters())
    module.to(device=param.device, dtype=param.dtype).eval().requires_grad_(False)
    return LoadedDrafter(kind=meta["kind"], module=module, meta=meta)


def merge_lora(target: nn.Module, folder: str | Path) -> nn.Module:
    """The target with a Medusa-2 drafter's LoRA adapter (`folder/lora`) merged in: the model that
    Medusa-2 decodes with (its own greedy output is the reference)."""
    from peft import PeftModel

    adapter = Path(folder) / "lora"
    if not (adapter / "adapter_model.safetensors").is_file():
        raise DraftsmithError(f"{adapter} has no adapter_model.safetensors; the drafter's metadata "
                              "says it was trained with LoRA (Medusa-2)")
    return PeftModel.from_pretrained(target, str(adapter)).merge_and_unload().eval()
