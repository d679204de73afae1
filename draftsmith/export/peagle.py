"""P-EAGLE in the two layouts vLLM serves with `parallel_drafting`: EAGLE-3's (`export/eagle3.py`)
plus the tensor `mask_hidden` [1, 1, 3H] and the mask token.

`peagle` (vLLM's `eagle3` layout): EAGLE-3's official layout (`LlamaForCausalLMEagle3`, `fc`,
`midlayer.*`, ...) with `mask_hidden`, `pard_token` and `mask_token_id` (the slot token: vLLM's
proposer reads `mask_token_id`, then `pard_token`, then `ptd_token_id`), `parallel_drafting:
true` and `num_speculative_tokens` (the depths trained; vLLM takes both from the speculative
config, not from here: they tell the reader how to serve it) and `norm_before_residual: false`
written out: draftsmith's layer feeds the raw hidden state to the residual, which vLLM's
`llama_eagle3` does with the key false or absent.

`peagle-speculators`: speculators' `PEagleSpeculatorConfig` (0.9.0): EAGLE-3's speculators layout
with `speculators_model_type: "peagle"`, `architectures: ["PEagleSpeculator"]`, `mask_token_id`,
`speculators_config.algorithm: "peagle"` and `speculative_tokens` the depths trained. vLLM's
`update_peagle` maps it to `PeagleLlamaForCausalLM` (its `Eagle3LlamaForCausalLM`) with
`pard_token = mask_token_id`, and serving the folder itself (`vllm serve DRAFTER`) turns its
method into `eagle3` with `parallel_drafting: true`. `update_peagle` (vLLM 0.32 and 0.33) copies
`norm_before_residual` (default false there, true for eagle3: written explicitly) but not EAGLE-3.1's
`fc_norm` / `norm_output`, so those are also written inside `transformer_layer_config`, which vLLM
keeps as the draft config (speculators reads the top level).

Serve either with `{"method": "eagle3", "parallel_drafting": true, "num_speculative_tokens": K}`:
without `parallel_drafting` vLLM skips `mask_hidden` (a warning) and drafts autoregressively, which
is not what was trained. SGLang's EAGLE-3 loader has no parallel slots; llama.cpp's converter has
no P-EAGLE (see the registry's `engine_methods`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import eagle3
from draftsmith.export.config_keys import MISSING
from draftsmith.export.record import ExportedDrafter, ExportOptions, ServingSection
from draftsmith.export.source import DraftsmithCheckpoint, cast_floats
from draftsmith.export.weights import write_weights

MASK = "mask_hidden"
NORMS = ("fc_norm", "norm_output")


def _settings(ckpt: DraftsmithCheckpoint) -> dict:
    return ckpt.meta.get("drafter_config") or {}


def _write(ckpt: DraftsmithCheckpoint, out: Path, opts: ExportOptions, write_layout) -> dict:
    """EAGLE-3's writer on every tensor but `mask_hidden`, which joins its weights file."""
    if MASK not in ckpt.tensors:
        raise DraftsmithError(f"{ckpt.folder}: tensor {MASK!r} is missing (not a P-EAGLE drafter)")
    mask = ckpt.tensors[MASK]
    width = 3 * ckpt.layer_config().hidden_size
    if tuple(mask.shape) != (1, 1, width):
        raise DraftsmithError(f"{ckpt.folder}: {MASK} has shape {tuple(mask.shape)}, expected "
                              f"(1, 1, {width}): one slot of the three fused target layers")
    rest = DraftsmithCheckpoint(ckpt.folder, ckpt.meta,
                                {k: v for k, v in ckpt.tensors.items() if k != MASK})
    config = write_layout(rest, out, opts)
    weights = out / eagle3.WEIGHTS_FILE
    write_weights({**load_file(weights), **cast_floats({MASK: mask}, opts.dtype)}, weights)
    return config


def _slot_keys(ckpt: DraftsmithCheckpoint) -> dict:
    token = _settings(ckpt).get("mask_token_id")
    if not isinstance(token, int):
        raise DraftsmithError(f"{ckpt.folder}: drafter_config.mask_token_id is not recorded; "
                              "retrain with this version of draftsmith (it records the token)")
    return {"mask_token_id": token, "norm_before_residual": False}


def write_peagle(ckpt: DraftsmithCheckpoint, out: Path, opts: ExportOptions) -> dict:
    """Write vLLM's `eagle3` layout with the parallel-drafting keys; returns config.json."""
    config = _write(ckpt, out, opts, eagle3.write_eagle3)
    slot = _slot_keys(ckpt)
    return {**config, **slot, "pard_token": slot["mask_token_id"], "parallel_drafting": True,
            "num_speculative_tokens": int(_settings(ckpt).get("num_depths", 1))}


def write_peagle_speculators(ckpt: DraftsmithCheckpoint, out: Path, opts: ExportOptions) -> dict:
    """Write speculators' P-EAGLE layout; returns config.json."""
    config = _write(ckpt, out, opts, eagle3.write_speculators)
    norms = {key: bool(_settings(ckpt).get(key, False)) for key in NORMS}
    spec = config["speculators_config"]
    methods = [{**spec["proposal_methods"][0],
                "speculative_tokens": int(_settings(ckpt).get("num_depths", 1))}]
    return {**config, **_slot_keys(ckpt), "architectures": ["PEagleSpeculator"],
            "speculators_model_type": "peagle",
            "transformer_layer_config": {**config["transformer_layer_config"], **norms},
            "speculators_config": {**spec, "algorithm": "peagle", "proposal_methods": methods}}


def matches_peagle(config: dict, names: set[str]) -> bool:
    return "speculators_model_type" not in config and MASK in names and \
        eagle3.matches_eagle3(config, names)


def matches_peagle_speculators(config: dict, names: set[str]) -> bool:
    return config.get("speculators_model_type") == "peagle"


def _as_peagle(drafter: ExportedDrafter, fmt: str, config: dict, mask: torch.Tensor,
               where: str) -> ExportedDrafter:
    token = config.get("mask_token_id", config.get("pard_token"))
    if not isinstance(token, int):
        raise DraftsmithError(f"{where}: P-EAGLE's mask token is missing (config.json "
                              "mask_token_id or pard_token)")
    if mask.numel() != 3 * drafter.hidden_size:
        raise DraftsmithError(f"{where}: {MASK} holds {mask.numel()} values, expected "
                              f"{3 * drafter.hidden_size} (three fused layers of hidden size "
                              f"{drafter.hidden_size})")
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    depths = config.get("num_speculative_tokens") or methods[0].get("speculative_tokens")
    drafter.format, drafter.kind = fmt, "peagle"
    drafter.state[MASK] = mask.reshape(1, 1, -1)
    drafter.settings = {**drafter.settings, "mask_token_id": token,
                        **({"num_depths": int(depths)} if depths else {})}
    return drafter


def _without_mask(tensors: dict, where: str) -> tuple[dict, torch.Tensor]:
    if MASK not in tensors:
        raise DraftsmithError(f"{where}: tensor {MASK!r} is missing; vLLM refuses to serve a "
                              "P-EAGLE drafter without it")
    return {k: v for k, v in tensors.items() if k != MASK}, tensors[MASK]


def read_peagle(config: dict, tensors: dict[str, torch.Tensor], where: str = "export"
                ) -> ExportedDrafter:
    """vLLM's `eagle3` layout with `mask_hidden` -> draftsmith's P-EAGLE names."""
    if config.get("norm_before_residual"):
        raise DraftsmithError(f"{where}: norm_before_residual is true; draftsmith's EAGLE-3 layer "
                              "feeds the un-normed hidden state to the residual")
    rest, mask = _without_mask(tensors, where)
    return _as_peagle(eagle3.read_eagle3(config, rest, where), "peagle", config, mask, where)


def read_peagle_speculators(config: dict, tensors: dict[str, torch.Tensor],
                            where: str = "export") -> ExportedDrafter:
    """speculators' P-EAGLE layout -> draftsmith's P-EAGLE names."""
    rest, mask = _without_mask(tensors, where)
    layer = config.get("transformer_layer_config") or {}
    merged = {**config, **{key: config.get(key, layer.get(key, False)) for key in NORMS}}
    drafter = eagle3.read_speculators(merged, rest, where)
    return _as_peagle(drafter, "peagle-speculators", config, mask, where)


def _slot_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    return [("mask_token_id", config.get("mask_token_id", MISSING),
             drafter.settings.get("mask_token_id")),
            ("norm_before_residual", config.get("norm_before_residual", MISSING), False)]


def peagle_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys vLLM reads from the `eagle3` layout, the slot token among them."""
    return [*eagle3.eagle3_config_keys(drafter, config), *_slot_config_keys(drafter, config),
            ("pard_token", config.get("pard_token", MISSING),
             drafter.settings.get("mask_token_id"))]


def peagle_speculators_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys vLLM reads from the speculators layout (`update_peagle`)."""
    layer = config.get("transformer_layer_config") or {}
    norms = [(f"transformer_layer_config.{key}", layer.get(key, MISSING),
              bool(drafter.settings.get(key, False))) for key in NORMS]
    return [*eagle3.speculators_config_keys(drafter, config),
            *_slot_config_keys(drafter, config), *norms]


def _vllm(base: str, drafter: str, settings: dict | None) -> ServingSection:
    tokens = int((settings or {}).get("num_depths", 4))
    return ServingSection("vLLM", (
        f"vllm serve {base} --speculative-config \\",
        f"  '{{\"method\": \"eagle3\", \"model\": \"{drafter}\", \"parallel_drafting\": true, "
        f"\"num_speculative_tokens\": {tokens}}}'"),
        note="`parallel_drafting` is required: without it vLLM drafts autoregressively and "
             "skips `mask_hidden`.")


def peagle_serving(base: str, drafter: str, settings: dict | None = None
                   ) -> list[ServingSection]:
    """Model card serving sections (vLLM only: SGLang and llama.cpp have no parallel slots)."""
    return [_vllm(base, drafter, settings),
            ServingSection("SGLang", note="Not served: SGLang's EAGLE-3 has no parallel slots "
                           "(it would draft autoregressively with this drafter).")]
