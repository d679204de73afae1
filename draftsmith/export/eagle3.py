"""EAGLE-3 in the two layouts serving engines load.

`eagle3` (official / SGLang / SpecForge): `config.json` of a one-layer Llama with
`architectures: ["LlamaForCausalLMEagle3"]`, `draft_vocab_size`, `target_hidden_size`,
`tie_word_embeddings: false` and the aux layer ids; weights `fc.weight [H, 3H]`, `midlayer.*`,
`norm.weight`, `lm_head.weight [Vd, H]`, `d2t` int64 [Vd], `t2d` bool [V], optional
`embed_tokens.weight` in `model.safetensors`. Matched against SGLang's `models/llama_eagle3.py`
(`LlamaForCausalLMEagle3`: reads `target_hidden_size`, ties the head to the embedding when
`tie_word_embeddings` is true, turns `d2t` into hot token ids) and SpecForge's
`configs/*-eagle3.json`.

The aux layer ids are written where every reader finds them, in its own numbering:
`eagle_config.eagle_aux_hidden_state_layer_ids` holds 0-based layer OUTPUTS, which SGLang 0.5.23
reads there and nowhere else (`set_eagle3_layers_to_capture` adds 1; SpecForge and the reference
EAGLE code read `hidden_states[i + 1]`). vLLM counts layer INPUTS (output + 1) and reads the
top-level `eagle_aux_hidden_state_layer_ids` first: its older runner (`gpu_model_runner.py`) then
falls back to `eagle_config.eagle_aux_hidden_state_layer_ids` taken as inputs (off by one for
these ids), its newer one (`gpu/spec_decode/eagle/eagle3_utils.py`) to `eagle_config.layer_ids`,
else to its default (2, N // 2, N - 3). So the top level and `eagle_config.layer_ids` carry the
inputs, and both vLLM runners and llama.cpp's converter read the right layers.

`speculators` (vLLM): `architectures: ["Eagle3DraftModel"]`, `speculators_model_type: "eagle3"`,
`transformer_layer_config`, `speculators_config` {algorithm, default_proposal_method,
proposal_methods, verifier}, the `norm_*` switches all false, and top-level
`eagle_aux_hidden_state_layer_ids` in vLLM's numbering: the index into `hidden_states`, i.e. the
layer output + 1 (vLLM captures the input of layer i; speculators' default is [2, N//2, N-3]).
Weights as above with `layers.0.*` instead of `midlayer.*`; `d2t`/`t2d` only when Vd < V. Matched
against speculators 0.9.0 (`Eagle3SpeculatorConfig`, `Eagle3DraftModel`, its Eagle-3 converter
that renames `midlayer.` to `layers.0.`) and vLLM's speculators config adapter, which requires
`speculators_config.proposal_methods[0].speculative_tokens`, `verifier.name_or_path` and
`transformer_layer_config`, and defaults `norm_before_residual` to true when the key is absent (it
is always written here).

vLLM serves both layouts; SGLang the `eagle3` one.

EAGLE-3.1 (`fc_norm`, `norm_output`; REFERENCE.md section 7.4) adds the weights
`fc_norm.{0,1,2}.weight [H]` beside `fc.weight` and the two booleans: top-level `fc_norm` /
`norm_output` in both layouts, which vLLM's `llama_eagle3` (`getattr(config, "fc_norm", False)`,
likewise `norm_output`) and SGLang's `llama_eagle3` read from config.json (both default false).
llama.cpp's converter reads neither (see `DrafterSpec.unserved_by`).
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
    base_model_id,
    cast_floats,
    float_dtype_name,
    llama_layer_dict,
    require_shape,
)
from draftsmith.export.validate import check_layer_ids
from draftsmith.export.weights import write_weights
from draftsmith.models.eagle3 import eagle3_layer_ids

WEIGHTS_FILE = "model.safetensors"
OUR_PREFIXES = ("embed_tokens.", "fc.", "fc_norm.", "midlayer.", "norm.", "lm_head.")
EAGLE31_KEYS = ("fc_norm", "norm_output")
OUR_BUFFERS = ("d2t", "t2d")
SPECULATIVE_TOKENS = 3  # speculators' own default proposal length; vLLM's flag overrides it


def _drafter_tensors(ckpt: DraftsmithCheckpoint, opts: ExportOptions) -> dict[str, torch.Tensor]:
    """The checkpoint's EAGLE-3 tensors, shape-checked against the recorded target config."""
    where = f"{ckpt.folder}"
    tensors = {k: v for k, v in ckpt.tensors.items() if not k.startswith("rotary.")}
    unknown = [k for k in tensors if not k.startswith(OUR_PREFIXES) and k not in OUR_BUFFERS]
    if unknown:
        raise DraftsmithError(f"{where}: unexpected tensors for an EAGLE-3 drafter: {unknown[:5]}")
    layer = ckpt.layer_config()
    hidden, vocab = layer.hidden_size, ckpt.target_config.vocab_size
    if "lm_head.weight" not in tensors:
        raise DraftsmithError(f"{where}: tensor 'lm_head.weight' is missing")
    draft_vocab = tensors["lm_head.weight"].shape[0]
    require_shape(tensors, "lm_head.weight", (draft_vocab, hidden), where)
    require_shape(tensors, "fc.weight", (hidden, 3 * hidden), where)
    require_shape(tensors, "midlayer.self_attn.q_proj.weight",
                  (layer.num_attention_heads * layer.head_dim, 2 * hidden), where)
    require_shape(tensors, "d2t", (draft_vocab,), where)
    require_shape(tensors, "t2d", (vocab,), where)
    fc_norm = _eagle31(ckpt)["fc_norm"]
    for i in range(3 if fc_norm else 0):
        require_shape(tensors, f"fc_norm.{i}.weight", (hidden,), where)
    if not fc_norm and any(k.startswith("fc_norm.") for k in tensors):
        raise DraftsmithError(f"{where}: fc_norm weights without drafter_config.fc_norm: true")
    if opts.skip_frozen:
        tensors.pop("embed_tokens.weight", None)
    return cast_floats(tensors, opts.dtype)


def _eagle31(ckpt: DraftsmithCheckpoint) -> dict[str, bool]:
    """The checkpoint's EAGLE-3.1 switches (false when not recorded: plain EAGLE-3)."""
    settings = ckpt.meta.get("drafter_config") or {}
    return {key: bool(settings.get(key, False)) for key in EAGLE31_KEYS}


def _layer_ids(ckpt: DraftsmithCheckpoint) -> list[int]:
    ids = ckpt.aux_layers() or (ckpt.meta.get("drafter_config") or {}).get("layer_ids") \
        or eagle3_layer_ids(ckpt.target_config.num_hidden_layers)
    check_layer_ids(list(ids), ckpt.target_config.num_hidden_layers, f"{ckpt.folder}")
    return list(ids)


def write_eagle3(ckpt: DraftsmithCheckpoint, out: Path, opts: ExportOptions) -> dict:
    """Write the official/SGLang layout; returns the config written to config.json."""
    tensors = _drafter_tensors(ckpt, opts)
    layer = ckpt.layer_config()
    vocab = ckpt.target_config.vocab_size
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_layer_dict(layer, vocab, float_dtype_name(tensors)),
        "draft_vocab_size": int(tensors["lm_head.weight"].shape[0]),
        "target_hidden_size": layer.hidden_size,
        # layer inputs for vLLM (and llama.cpp), outputs for SGLang: see the module docstring
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in _layer_ids(ckpt)],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": _layer_ids(ckpt),
                         "layer_ids": [i + 1 for i in _layer_ids(ckpt)],
                         "use_aux_hidden_state": True},
        **_eagle31(ckpt),
    }
    write_weights(tensors, out / WEIGHTS_FILE)
    return config


def write_speculators(ckpt: DraftsmithCheckpoint, out: Path, opts: ExportOptions) -> dict:
    """Write the speculators layout vLLM serves; returns the config written to config.json."""
    tensors = _drafter_tensors(ckpt, opts)
    layer = ckpt.layer_config()
    target = ckpt.target_config
    vocab = target.vocab_size
    draft_vocab = int(tensors["lm_head.weight"].shape[0])
    renamed = {("layers.0." + k.removeprefix("midlayer.")) if k.startswith("midlayer.") else k: v
               for k, v in tensors.items()}
    if draft_vocab == vocab:  # speculators builds no mapping buffers for a full draft vocab
        renamed = {k: v for k, v in renamed.items() if k not in OUR_BUFFERS}
    verifier = opts.base_model or base_model_id(ckpt.meta.get("target"))
    config = {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": layer.hidden_size,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in _layer_ids(ckpt)],
        "norm_before_residual": False,
        "norm_before_fc": False,
        **_eagle31(ckpt),
        "embed_requires_grad": False,
        "transformer_layer_config": llama_layer_dict(layer, vocab, float_dtype_name(tensors)),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": SPECULATIVE_TOKENS,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier,
                         "architectures": list(getattr(target, "architectures", None) or [])},
        },
        "torch_dtype": float_dtype_name(tensors),
    }
    write_weights(renamed, out / WEIGHTS_FILE)
    return config


def matches_eagle3(config: dict, names: set[str]) -> bool:
    archs = config.get("architectures") or []
    return "speculators_model_type" not in config and (
        any("Eagle3" in a for a in archs) or any(n.startswith("midlayer.") for n in names))


def matches_speculators(config: dict, names: set[str]) -> bool:
    return config.get("speculators_model_type") == "eagle3"


def _read_common(fmt: str, tensors: dict[str, torch.Tensor], hidden: int, vocab: int | None,
                 draft_vocab: int | None, ids: list[int], base_model: str | None,
                 where: str, config: dict) -> ExportedDrafter:
    unknown = [k for k in tensors if not k.startswith(OUR_PREFIXES) and k not in OUR_BUFFERS]
    if unknown:
        raise DraftsmithError(f"{where}: tensors draftsmith's EAGLE-3 drafter does not have: "
                              f"{unknown[:5]} (more than one decoder layer, or a variant with "
                              "extra norms other than EAGLE-3.1's fc_norm, is not supported)")
    eagle31 = {key: bool(config.get(key, False)) for key in EAGLE31_KEYS}
    norms = sorted(k for k in tensors if k.startswith("fc_norm."))
    wanted = [f"fc_norm.{i}.weight" for i in range(3)] if eagle31["fc_norm"] else []
    if norms != wanted:
        raise DraftsmithError(f"{where}: config.json has fc_norm: {eagle31['fc_norm']} but the "
                              f"weights hold {norms or 'no fc_norm tensors'}; EAGLE-3.1's fc_norm "
                              "is one norm per fused layer, fc_norm.{0,1,2}.weight")
    if ids and len(ids) != 3:
        raise DraftsmithError(f"{where}: EAGLE-3 fuses 3 target layers but the aux layer ids are "
                              f"{ids}")
    if "fc.bias" in tensors:
        raise DraftsmithError(f"{where}: an `fc` with bias is not supported by draftsmith's EAGLE-3")
    if "lm_head.weight" not in tensors:
        raise DraftsmithError(f"{where}: lm_head.weight is missing (EAGLE-3's head is trained; it "
                              "cannot be taken from the target)")
    rows = tensors["lm_head.weight"].shape[0]
    draft_vocab = draft_vocab or rows
    if rows != draft_vocab:
        raise DraftsmithError(f"{where}: draft_vocab_size={draft_vocab} but lm_head.weight has "
                              f"{rows} rows")
    if "d2t" not in tensors:
        if vocab is not None and draft_vocab != vocab:
            raise DraftsmithError(f"{where}: draft_vocab_size={draft_vocab} < vocab_size={vocab} "
                                  "but the d2t / t2d vocabulary mapping is missing")
        tensors["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
        tensors["t2d"] = torch.ones(vocab or draft_vocab, dtype=torch.bool)
    tensors["d2t"] = tensors["d2t"].long()
    tensors["t2d"] = tensors["t2d"].bool()
    return ExportedDrafter(
        format=fmt, kind="eagle3",
        settings={"draft_vocab_size": draft_vocab, "layer_ids": list(ids) or None, **eagle31},
        state=tensors, hidden_size=hidden, vocab_size=vocab, draft_vocab_size=draft_vocab,
        aux_layer_ids=list(ids), base_model=base_model)


def read_eagle3(config: dict, tensors: dict[str, torch.Tensor], where: str = "export"
                ) -> ExportedDrafter:
    """Official/SGLang layout -> draftsmith EAGLE-3 names (already the same)."""
    if config.get("num_hidden_layers", 1) != 1:
        raise DraftsmithError(f"{where}: num_hidden_layers={config['num_hidden_layers']}; "
                              "draftsmith's EAGLE-3 has exactly one decoder layer")
    hidden = config.get("hidden_size") or tensors["fc.weight"].shape[0]
    target_hidden = config.get("target_hidden_size") or hidden
    if target_hidden != hidden:
        raise DraftsmithError(f"{where}: target_hidden_size={target_hidden} differs from the "
                              f"drafter's hidden_size={hidden}; draftsmith's EAGLE-3 needs them equal")
    ids = list((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [])
    return _read_common("eagle3", dict(tensors), hidden, config.get("vocab_size"),
                        config.get("draft_vocab_size"), ids, None, where, config)


def read_speculators(config: dict, tensors: dict[str, torch.Tensor], where: str = "export"
                     ) -> ExportedDrafter:
    """speculators layout -> draftsmith EAGLE-3 names (`layers.0.` -> `midlayer.`)."""
    unsupported = [k for k in ("norm_before_residual", "norm_before_fc") if config.get(k)]
    if unsupported:
        raise DraftsmithError(f"{where}: speculators options {unsupported} are set; draftsmith's "
                              "EAGLE-3 layer implements neither (of the norm options it "
                              "implements EAGLE-3.1's fc_norm and norm_output)")
    layer = config.get("transformer_layer_config") or {}
    if layer.get("num_hidden_layers", 1) != 1:
        raise DraftsmithError(f"{where}: transformer_layer_config.num_hidden_layers="
                              f"{layer['num_hidden_layers']}; draftsmith's EAGLE-3 has one layer")
    hidden = layer.get("hidden_size") or tensors["fc.weight"].shape[0]
    target_hidden = config.get("target_hidden_size") or hidden
    if target_hidden != hidden:
        raise DraftsmithError(f"{where}: target_hidden_size={target_hidden} differs from the "
                              f"drafter's hidden_size={hidden}; draftsmith's EAGLE-3 needs them equal")
    renamed = {("midlayer." + k.removeprefix("layers.0.")) if k.startswith("layers.0.") else k: v
               for k, v in tensors.items()}
    ids = [i - 1 for i in config.get("eagle_aux_hidden_state_layer_ids") or []]
    verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return _read_common("speculators", renamed, hidden, layer.get("vocab_size"),
                        config.get("draft_vocab_size"), ids, verifier, where, config)


def _eagle3_keys(drafter: ExportedDrafter, config: dict, layer: dict, where: str) -> list:
    state = drafter.state
    implied = {"hidden_size": rows(state, "fc.weight"), "vocab_size": rows(state, "t2d"),
               **layer_keys(layer, state, "midlayer.")}
    keys = [(where + k, layer.get(k, MISSING), v) for k, v in implied.items()]
    keys.append(("draft_vocab_size", config.get("draft_vocab_size", MISSING),
                 rows(state, "lm_head.weight")))
    return keys


def eagle3_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys SGLang, vLLM and the EAGLE code read (see `export/config_keys.py`): the
    aux layer inputs where vLLM's two runners read them, agreeing with SGLang's outputs."""
    inputs = [i + 1 for i in drafter.aux_layer_ids] or None
    flags = config.get("eagle_config") or {}
    return [*_eagle3_keys(drafter, config, config, ""),
            ("eagle_aux_hidden_state_layer_ids",
             config.get("eagle_aux_hidden_state_layer_ids", MISSING), inputs),
            ("eagle_config.layer_ids", flags.get("layer_ids", MISSING), inputs)]


def speculators_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys vLLM reads from the speculators layout (see `export/config_keys.py`)."""
    layer = config.get("transformer_layer_config") or {}
    keys = _eagle3_keys(drafter, config, layer, "transformer_layer_config.")
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    return [*keys, ("speculators_config.proposal_methods[0].speculative_tokens",
                     methods[0].get("speculative_tokens", MISSING), None),
            ("speculators_config.verifier.name_or_path",
             verifier.get("name_or_path", MISSING), None)]


def eagle3_serving(base: str, drafter: str, settings: dict | None = None
                   ) -> list[ServingSection]:
    """Model card serving sections of the official / SGLang layout (vLLM reads it too)."""
    return [sglang_command(base, drafter, "EAGLE3"), vllm_command(base, drafter, "eagle3", 3)]


def speculators_serving(base: str, drafter: str, settings: dict | None = None
             ) -> list[ServingSection]:
    """Model card serving sections of the speculators layout."""
    return [vllm_command(base, drafter, "eagle3", 3),
            ServingSection("SGLang", note="Not from this folder: export with `--format eagle3` "
                           "for SGLang.")]


def eagle3_gguf_stage(config: dict, where: str) -> list[int]:
    """Both layouts for llama.cpp's converter, which reads the fused layers as layer INPUTS from a
    top-level `eagle_aux_hidden_state_layer_ids` and ignores `eagle_config` (falling back to
    [2, N//2, N-3]): the official layout's 0-based outputs are written there as inputs, the
    speculators layout already keeps them so. Returns those inputs.

    Raises:
        DraftsmithError: no three aux layer ids recorded.
    """
    if "speculators_model_type" in config:  # vLLM's numbering already, at the top level
        ids = list(config.get("eagle_aux_hidden_state_layer_ids") or [])
    else:
        outputs = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        ids = [i + 1 for i in outputs or []]
        config["eagle_aux_hidden_state_layer_ids"] = ids
    if len(ids) != 3:
        raise DraftsmithError(f"{where}/config.json records no EAGLE-3 aux layer ids "
                              "(eagle_config.eagle_aux_hidden_state_layer_ids); re-export it with "
                              "`draftsmith export CKPT --format eagle3`")
    return ids
