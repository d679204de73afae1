"""MTP modules in the DeepSeek-V3 layout (`--format mtp`).

DeepSeek-V3 stores its multi-token-prediction module as extra decoder layers numbered after the
target's N layers. Module k (0-based) is written as `model.layers.{N+k}.*`: `enorm`, `hnorm`,
`eh_proj` (input cat(embedding, hidden), embedding first), `input_layernorm`, `self_attn.*`,
`mlp.*`, `post_attention_layernorm`, `shared_head.norm`, and the frozen copies
`shared_head.head` and `embed_tokens` that DeepSeek-V3 repeats in every MTP layer (left out with
`skip_frozen`; `load.py` then takes them from the target). `config.json` is the target's
config plus `num_nextn_predict_layers: K`. Matched against the weight names vLLM's
`deepseek_mtp.py` and SGLang's `deepseek_nextn.py` load (`enorm`, `hnorm`, `eh_proj`,
`shared_head.{norm,head}`, `embed_tokens` per MTP layer) and REFERENCE.md section 3.

This is the DeepSeek-V3 numbering, not SGLang's NextN export (which renumbers the module to layer
0 with `architectures: ["DeepseekV3ForCausalLMNextN"]`); `load.py` reads both. The block inside
is the target's Llama/Qwen2-style layer (GQA attention, dense MLP), so engines serve it only for
targets whose architecture has native MTP support; for Llama/Qwen2 targets it is an interchange
format that draftsmith evaluates.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.config_keys import MISSING, layer_keys, rows
from draftsmith.export.record import ExportedDrafter, ExportOptions, ServingSection
from draftsmith.export.source import (
    DraftsmithCheckpoint,
    cast_floats,
    float_dtype_name,
    require_shape,
)
from draftsmith.export.weights import write_weights

WEIGHTS_FILE = "model.safetensors"
LAYER_TENSOR = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
MODULE_TENSOR = re.compile(r"^layers\.(\d+)\.(.+)$")
BLOCK_PARTS = ("self_attn.", "mlp.", "post_attention_layernorm.")
SHARED_WITH_TARGET = {"embed_tokens.weight": "embed_tokens.weight", "lm_head.weight": "shared_head.head.weight"}


def _to_deepseek(part: str) -> str:
    """draftsmith module-relative name -> DeepSeek layer-relative name."""
    return part.removeprefix("block.")


def _from_deepseek(part: str) -> str:
    return "block." + part if part.startswith(BLOCK_PARTS) else part


def write_mtp(ckpt: DraftsmithCheckpoint, out: Path, opts: ExportOptions) -> dict:
    """Write the DeepSeek-V3 layout; returns the config written to config.json."""
    where = f"{ckpt.folder}"
    target = ckpt.target_config
    first, hidden = target.num_hidden_layers, target.hidden_size
    tensors: dict[str, torch.Tensor] = {}
    for name, value in ckpt.tensors.items():
        match = MODULE_TENSOR.match(name)
        if match:
            tensors[f"model.layers.{first + int(match[1])}.{_to_deepseek(match[2])}"] = value
        elif name not in SHARED_WITH_TARGET and not name.startswith("rotary."):
            raise DraftsmithError(f"{where}: unexpected tensor {name!r} for MTP modules")
    modules = len({int(m[1]) for m in map(MODULE_TENSOR.match, ckpt.tensors) if m})
    if modules == 0:
        raise DraftsmithError(f"{where}: no MTP module tensors (layers.{{k}}.*)")
    for k in range(modules):
        require_shape(tensors, f"model.layers.{first + k}.eh_proj.weight", (hidden, 2 * hidden),
                      where)
        for ours, theirs in SHARED_WITH_TARGET.items():
            if ours in ckpt.tensors and not opts.skip_frozen:
                tensors[f"model.layers.{first + k}.{theirs}"] = ckpt.tensors[ours]
    tensors = cast_floats(tensors, opts.dtype)
    config = {**ckpt.meta["target_config"], "num_nextn_predict_layers": modules}
    config["torch_dtype"] = float_dtype_name(tensors)
    write_weights(tensors, out / WEIGHTS_FILE)
    return config


def matches_mtp(config: dict, names: set[str]) -> bool:
    archs = config.get("architectures") or []
    return ("num_nextn_predict_layers" in config or any("NextN" in a for a in archs)
            or any(n.endswith(".eh_proj.weight") for n in names))


def read_mtp(config: dict, tensors: dict[str, torch.Tensor], where: str = "export"
             ) -> ExportedDrafter:
    """DeepSeek-V3 (layers N..N+K-1) or SGLang NextN (from layer 0) -> draftsmith `layers.{k}.*`."""
    by_layer: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        match = LAYER_TENSOR.match(name)
        if not match:
            raise DraftsmithError(f"{where}: {name!r} is not an MTP layer tensor "
                                  "(model.layers.{n}.*)")
        by_layer.setdefault(int(match[1]), {})[match[2]] = value
    if not by_layer:
        raise DraftsmithError(f"{where}: no MTP layer tensors (model.layers.{{n}}.eh_proj.weight, ...)")
    numbers = sorted(by_layer)
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise DraftsmithError(f"{where}: MTP layers {numbers} are not consecutive")
    state: dict[str, torch.Tensor] = {}
    for k, number in enumerate(numbers):
        parts = dict(by_layer[number])
        for ours, theirs in SHARED_WITH_TARGET.items():
            copy = parts.pop(theirs, None)
            if copy is None:
                continue
            if ours in state and not torch.equal(state[ours], copy):
                raise DraftsmithError(f"{where}: layer {number} carries a different {theirs} than "
                                      "the first MTP layer; draftsmith shares one frozen copy")
            state[ours] = copy
        for part, value in parts.items():
            state[f"layers.{k}.{_from_deepseek(part)}"] = value
    eh_proj = state.get("layers.0.eh_proj.weight")
    if eh_proj is None:
        raise DraftsmithError(f"{where}: layer {numbers[0]} has no eh_proj.weight")
    hidden = eh_proj.shape[0]
    vocab = config.get("vocab_size")
    if "embed_tokens.weight" in state:
        vocab = vocab or state["embed_tokens.weight"].shape[0]
    expected = config.get("num_nextn_predict_layers", len(numbers))
    if expected != len(numbers):
        raise DraftsmithError(f"{where}: num_nextn_predict_layers={expected} but the weights hold "
                              f"{len(numbers)} MTP layer(s)")
    return ExportedDrafter(format="mtp", kind="mtp", settings={"num_modules": len(numbers)},
                           state=state, hidden_size=hidden, vocab_size=vocab,
                           mtp_first_layer=numbers[0])


def mtp_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys the engines' MTP loaders read (see `export/config_keys.py`)."""
    state = drafter.state
    implied = {"hidden_size": rows(state, "layers.0.eh_proj.weight"),
               "vocab_size": rows(state, "embed_tokens.weight"),
               "num_hidden_layers": None,
               "num_nextn_predict_layers": drafter.settings["num_modules"],
               **layer_keys(config, state, "layers.0.block.")}
    return [(k, config.get(k, MISSING), v) for k, v in implied.items()]


def mtp_serving(base: str, drafter: str, settings: dict | None = None
             ) -> list[ServingSection]:
    """Model card serving sections of the MTP layout."""
    return [ServingSection("vLLM / SGLang", note="Not from this folder: engines serve MTP modules "
                           "(`method: mtp` / NextN) only for targets with native MTP support "
                           "(DeepSeek-V3 and similar); for this target evaluate it with "
                           "draftsmith.")]
