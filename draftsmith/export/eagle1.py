"""EAGLE-1/2 layout (`--format eagle`): the checkpoints of SafeAILab/EAGLE's first release, which
vLLM (`method: "eagle"`) and SGLang (`--speculative-algorithm EAGLE`) load.

`config.json`: a one-layer Llama config with `architectures: ["LlamaForCausalLMEagle",
"LlamaForCausalLM"]`. SGLang builds the first registered name it finds, its EAGLE-1 class
`LlamaForCausalLMEagle` (`models/llama_eagle.py`); given only `LlamaForCausalLM` it builds a plain
Llama whose loader skips `fc.*` and `layers.0.*`. vLLM prefixes "Eagle" to every name for
`method: "eagle"` and builds the first one it has, `EagleLlamaForCausalLM`. No `bias` key: both
engines read `bias: true` as attention biases (q/k/v/o), which an EAGLE-1 layer has none of.

Weights in `model.safetensors`: `fc.weight [H, 2H]` (input = cat(embedding, feature), embedding
first), `fc.bias [H]`, `layers.0.self_attn.{q,k,v,o}_proj.weight`,
`layers.0.mlp.{gate,up,down}_proj.weight`, `layers.0.post_attention_layernorm.weight` (layer 0 has
no input_layernorm) and the frozen `embed_tokens.weight` (the reference loads its state dict
strictly, so it is kept unless `skip_frozen`). The token head is the target's own and is not
stored. `fc.bias` is always written: SGLang and the reference build `fc` with a bias and load it
(a missing one would stay uninitialised in SGLang); vLLM builds `fc` without one and drops the
tensor, so it serves only drafters whose bias is zero (`drafter.fc_bias: false`, the default). A
drafter with a trained bias is exported with a warning, its card names SGLang only, and
serve-check refuses it in vLLM (`DrafterSpec.unserved_by`). Matched against SafeAILab/EAGLE
`eagle/model/ea_model.py` and `cnets.py`, SGLang 0.5.23 `models/llama_eagle.py`, vLLM 0.32 / 0.33
`models/llama_eagle.py` and `transformers_utils/configs/eagle.py`, and REFERENCE.md section 3.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.config_keys import MISSING, layer_keys, rows
from draftsmith.export.record import (
    ExportedDrafter,
    ExportOptions,
    ServingSection,
    sglang_command,
    vllm_command,
)
from draftsmith.export.source import (
    DraftsmithCheckpoint,
    cast_floats,
    float_dtype_name,
    llama_layer_dict,
    require_shape,
)
from draftsmith.export.weights import write_weights
from draftsmith.registry import EAGLE1_BIASED_FC_NOT_IN_VLLM

WEIGHTS_FILE = "model.safetensors"
PREFIXES = ("embed_tokens.", "fc.", "layers.0.")
# SGLang's EAGLE-1 class first (it takes the first name it has); vLLM's `method: "eagle"` turns
# the second into its `EagleLlamaForCausalLM`.
ARCHITECTURES = ["LlamaForCausalLMEagle", "LlamaForCausalLM"]


def write_eagle(ckpt: DraftsmithCheckpoint, out: Path, opts: ExportOptions) -> dict:
    """Write the EAGLE-1/2 layout; returns the config written to config.json."""
    where = f"{ckpt.folder}"
    layer = ckpt.layer_config()
    hidden, vocab = layer.hidden_size, ckpt.target_config.vocab_size
    tensors = {k: v for k, v in ckpt.tensors.items() if k.startswith(PREFIXES)}
    unknown = sorted(set(ckpt.tensors) - set(tensors) - {"lm_head.weight"})
    if unknown:
        raise DraftsmithError(f"{where}: unexpected tensors for an EAGLE-1 drafter: {unknown[:5]}")
    require_shape(tensors, "fc.weight", (hidden, 2 * hidden), where)
    tensors.setdefault("fc.bias", torch.zeros(hidden, dtype=tensors["fc.weight"].dtype))
    require_shape(tensors, "fc.bias", (hidden,), where)
    if has_fc_bias(tensors):
        warnings.warn(f"{where}: {EAGLE1_BIASED_FC_NOT_IN_VLLM}", stacklevel=2)
    if opts.skip_frozen:
        tensors.pop("embed_tokens.weight", None)
    tensors = cast_floats(tensors, opts.dtype)
    config = {"architectures": list(ARCHITECTURES),
              **llama_layer_dict(layer, vocab, float_dtype_name(tensors))}
    write_weights(tensors, out / WEIGHTS_FILE)
    return config


def has_fc_bias(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether `fc.bias` holds a trained (nonzero) bias, which vLLM would drop."""
    bias = tensors.get("fc.bias")
    return bias is not None and bool(bias.any())


def matches_eagle(config: dict, names: set[str]) -> bool:
    """A one-layer Llama config with `fc` and `layers.0.*` weights and no EAGLE-3 markers."""
    return ("fc.weight" in names and any(n.startswith("layers.0.") for n in names)
            and "speculators_model_type" not in config and "draft_vocab_size" not in config
            and config.get("num_hidden_layers", 1) == 1)


def read_eagle(config: dict, tensors: dict[str, torch.Tensor], where: str = "export"
               ) -> ExportedDrafter:
    """EAGLE-1/2 layout -> draftsmith EAGLE-1 names (the same; a missing fc bias means zeros)."""
    unknown = sorted(k for k in tensors if not k.startswith(PREFIXES))
    if unknown:
        raise DraftsmithError(f"{where}: tensors draftsmith's EAGLE-1 drafter does not have: "
                              f"{unknown[:5]}")
    if "layers.0.input_layernorm.weight" in tensors:
        raise DraftsmithError(f"{where}: layer 0 has an input_layernorm; EAGLE-1's layer has none "
                              "(is this an EAGLE-3 checkpoint without its config?)")
    hidden = tensors["fc.weight"].shape[0]
    if tuple(tensors["fc.weight"].shape) != (hidden, 2 * hidden):
        raise DraftsmithError(f"{where}: fc.weight has shape {list(tensors['fc.weight'].shape)}, "
                              f"not [H, 2H] = [{hidden}, {2 * hidden}] as EAGLE-1 needs")
    state = dict(tensors)
    state.setdefault("fc.bias", torch.zeros(hidden, dtype=tensors["fc.weight"].dtype))
    vocab = config.get("vocab_size")
    if "embed_tokens.weight" in state:
        vocab = vocab or state["embed_tokens.weight"].shape[0]
    return ExportedDrafter(format="eagle", kind="eagle1",
                           settings={"fc_bias": has_fc_bias(state)}, state=state,
                           hidden_size=int(config.get("hidden_size") or hidden), vocab_size=vocab)


def eagle_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys SGLang, vLLM and the EAGLE code read (see `export/config_keys.py`): also
    the architecture SGLang builds and no `bias: true` (both engines would build attention biases
    that the layer does not have)."""
    state = drafter.state
    implied = {"hidden_size": rows(state, "fc.weight"),
               "vocab_size": rows(state, "embed_tokens.weight"),
               **layer_keys(config, state, "layers.0.")}
    archs = config.get("architectures") or [MISSING]
    return [*((k, config.get(k, MISSING), v) for k, v in implied.items()),
            ("architectures[0]", archs[0], ARCHITECTURES[0]),
            ("bias", config.get("bias", False), False),
            ("attention_bias", config.get("attention_bias", False), False)]


def eagle_serving(base: str, drafter: str, settings: dict | None = None
             ) -> list[ServingSection]:
    """Model card serving sections of the EAGLE-1/2 layout (vLLM only for a bias-free fc)."""
    vllm = (ServingSection("vLLM", note=f"Not served by vLLM: {EAGLE1_BIASED_FC_NOT_IN_VLLM}.")
            if (settings or {}).get("fc_bias") else vllm_command(base, drafter, "eagle", 5))
    return [vllm, sglang_command(base, drafter, "EAGLE")]
