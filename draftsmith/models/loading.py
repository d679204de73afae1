"""Loading a trained drafter folder (safetensors + draftsmith_drafter.json) for a given target,
with the checks that catch train/serve mismatches before any decoding."""

from __future__ import annotations

import json
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


def check_against_target(meta: dict, target_config) -> None:
    """Hidden size, vocab size and layer count recorded at training must match the target.

    Raises:
        DraftsmithError: naming the field and both values.
    """
    trained = meta.get("target_config", {})
    for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
        if key in trained and trained[key] != getattr(target_config, key, None):
            raise DraftsmithError(
                f"drafter was trained for a target with {key}={trained[key]} but this target has "
                f"{key}={getattr(target_config, key, None)} ({meta.get('target', '?')} vs the "
                "target given); evaluate it with the target it was trained on")


def load_drafter(folder: str | Path, target: nn.Module) -> LoadedDrafter:
    """Rebuild the drafter of `folder` for `target` and load its weights (safetensors only).

    Raises:
        DraftsmithError: missing files, a pickle checkpoint, or a mismatch with the target.
    """
    from safetensors.torch import load_file

    from draftsmith.registry import get_spec

    folder = Path(folder)
    if not (folder / DRAFTER_CONFIG).is_file():
        pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        hint = f" (found pickle files {pickles}: draftsmith only loads safetensors)" if pickles else ""
        raise DraftsmithError(f"{folder} is not a draftsmith drafter: {DRAFTER_CONFIG} is missing"
                              f"{hint}")
    meta = json.loads((folder / DRAFTER_CONFIG).read_text())
    check_against_target(meta, target.config)
    spec = get_spec(meta["kind"])
    module = spec.build(target.config, spec.make_config(meta.get("drafter_config", {})))
    state = load_file(folder / WEIGHTS)
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.")]
    if unexpected or any(not k.startswith(("embed_tokens", "lm_head")) for k in missing):
        raise DraftsmithError(f"{folder / WEIGHTS} does not fit a {meta['kind']} drafter: "
                              f"missing {missing[:5]}, unexpected {unexpected[:5]}")
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
