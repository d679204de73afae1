"""EAGLE-1/2 layout (`--format eagle`): the checkpoints of SafeAILab/EAGLE's first release, which
vLLM (`method: "eagle"`) and SGLang (`--speculative-algorithm EAGLE`) load.

`config.json`: a one-layer `LlamaForCausalLM` config plus `"bias": true` (the reference
`EaModel` reads `bias` to build `fc`). Weights in `model.safetensors`: `fc.weight [H, 2H]`
(input = cat(embedding, feature), embedding first), `fc.bias [H]`,
`layers.0.self_attn.{q,k,v,o}_proj.weight`, `layers.0.mlp.{gate,up,down}_proj.weight`,
`layers.0.post_attention_layernorm.weight` (layer 0 has no input_layernorm) and the frozen
`embed_tokens.weight` (the reference loads its state dict strictly, so it is kept unless
`skip_frozen`). The token head is the target's own and is not stored. Matched against
SafeAILab/EAGLE `eagle/model/ea_model.py` and `cnets.py` and REFERENCE.md section 3.
"""

from __future__ import annotations

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

WEIGHTS_FILE = "model.safetensors"
PREFIXES = ("embed_tokens.", "fc.", "layers.0.")


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
    require_shape(tensors, "fc.bias", (hidden,), where)
    if opts.skip_frozen:
        tensors.pop("embed_tokens.weight", None)
    tensors = cast_floats(tensors, opts.dtype)
    config = {"architectures": ["LlamaForCausalLM"],
              **llama_layer_dict(layer, vocab, float_dtype_name(tensors)), "bias": True}
    write_weights(tensors, out / WEIGHTS_FILE)
    return config


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
    return ExportedDrafter(format="eagle", kind="eagle1", settings={}, state=state,
                           hidden_size=int(config.get("hidden_size") or hidden), vocab_size=vocab)


def eagle_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys SGLang and the EAGLE code read (see `export/config_keys.py`)."""
    state = drafter.state
    implied = {"hidden_size": rows(state, "fc.weight"),
               "vocab_size": rows(state, "embed_tokens.weight"),
               **layer_keys(config, state, "layers.0.")}
    return [(k, config.get(k, MISSING), v) for k, v in implied.items()]


def eagle_serving(base: str, drafter: str, settings: dict | None = None
             ) -> list[ServingSection]:
    """Model card serving sections of the EAGLE-1/2 layout."""
    return [vllm_command(base, drafter, "eagle", 5), sglang_command(base, drafter, "EAGLE")]
