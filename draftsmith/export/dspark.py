"""DSpark block drafters in DeepSpec's layout.

`dspark` (deepseek-ai/DeepSpec `save_pretrained`; vLLM `method: dspark`): `architectures:
["Qwen3DSparkModel"]` with the Qwen3 body and top-level `block_size, mask_token_id,
target_layer_ids, num_target_layers, markov_rank, markov_head_type: "vanilla",
enable_confidence_head, confidence_head_with_markov, sample_from_anchor: true` (row k predicts
anchor + k + 1: B proposals a block); weights as DFlash's plus `markov_head.markov_w{1,2}.weight`,
`confidence_head.proj.{weight,bias}`, and (DeepSpec ships them) `embed_tokens` / `lm_head`.

The Qwen3 body, the tensor checks and the reading rules are DFlash's
(`draftsmith.export.dflash`). See ../shared/REFERENCE.md sections 7.1.4 and 7.2.
"""

from __future__ import annotations

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export.config_keys import MISSING
from draftsmith.export.dflash import (
    WEIGHTS_FILE,
    block_settings,
    body_keys,
    drafter_tensors,
    ids_implied,
    proposals,
    qwen3_body,
    read_block,
)
from draftsmith.export.dflash_llama_cpp import refuse_llama3_rope
from draftsmith.export.record import ExportedDrafter, ExportOptions, ServingSection, vllm_command
from draftsmith.export.source import DraftsmithCheckpoint, float_dtype_name, require_shape
from draftsmith.export.weights import write_weights

DSPARK_PREFIXES = ("markov_head.", "confidence_head.")
SGLANG_DSPARK_NOTE = (
    "SGLang 0.5.23 builds `Qwen3DSparkModel` (`models/dspark.py`): the Qwen3 block and the Markov "
    "head from this folder, the embedding and output head from the target. Under its default "
    "`SGLANG_RAGGED_VERIFY_MODE=static` it drafts the whole block every step and skips the "
    "confidence head; `cap-accept` or `compact` load it and set each request's verify length from "
    "it (`speculative/dspark_components/dspark_planner.py`).")


def write_dspark(ckpt: DraftsmithCheckpoint, out, opts: ExportOptions) -> dict:
    """Write DeepSpec's DSpark layout; returns the config written to config.json."""
    settings = block_settings(ckpt)
    tensors = drafter_tensors(ckpt, settings, DSPARK_PREFIXES, not opts.skip_frozen, opts.dtype)
    rank = (ckpt.meta.get("drafter_config") or {}).get("markov_rank")
    vocab = ckpt.target_config.vocab_size
    require_shape(tensors, "markov_head.markov_w1.weight", (vocab, rank), f"{ckpt.folder}")
    config = {
        "architectures": ["Qwen3DSparkModel"],
        **qwen3_body(ckpt, settings["num_layers"], float_dtype_name(tensors)),
        "block_size": settings["block_size"],
        "mask_token_id": settings["mask_token_id"],
        "target_layer_ids": settings["target_layer_ids"],
        "num_target_layers": ckpt.target_config.num_hidden_layers,
        "target_hidden_size": ckpt.layer_config().hidden_size,
        "num_anchors": (ckpt.meta.get("drafter_config") or {}).get("anchors_per_sequence"),
        "markov_rank": rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "sample_from_anchor": True,
    }
    write_weights(tensors, out / WEIGHTS_FILE)
    return config


def matches_dspark(config: dict, names: set[str]) -> bool:
    archs = config.get("architectures") or []
    return "speculators_model_type" not in config and (
        any("DSpark" in a for a in archs) or any(n.startswith("markov_head.") for n in names))


def read_dspark(config: dict, tensors: dict[str, torch.Tensor], where: str = "export"
                ) -> ExportedDrafter:
    """DeepSpec's DSpark layout -> draftsmith DSpark names (already the same)."""
    if config.get("markov_head_type", "vanilla") != "vanilla":
        raise DraftsmithError(f"{where}: markov_head_type={config['markov_head_type']!r}; "
                              "draftsmith's DSpark has the `vanilla` Markov head only")
    if not config.get("sample_from_anchor", True):
        raise DraftsmithError(f"{where}: sample_from_anchor=false; draftsmith's DSpark predicts "
                              "anchor + k + 1 at row k (DeepSpec's layout)")
    if config.get("enable_confidence_head") is False:
        raise DraftsmithError(f"{where}: enable_confidence_head=false; draftsmith's DSpark has a "
                              "confidence head")
    settings = {"block_size": config.get("block_size"),
                "target_layer_ids": config.get("target_layer_ids"),
                "mask_token_id": config.get("mask_token_id")}
    w1 = tensors.get("markov_head.markov_w1.weight")
    settings["markov_rank"] = config.get("markov_rank") or (int(w1.shape[1]) if w1 is not None
                                                              else None)
    return read_block("dspark", "dspark", DSPARK_PREFIXES, config, config, tensors, settings,
                       None, where)


def dspark_config_keys(drafter: ExportedDrafter, config: dict) -> list:
    """config.json keys vLLM reads from DeepSpec's layout."""
    ids = config.get("target_layer_ids", MISSING)
    w1 = drafter.state.get("markov_head.markov_w1.weight")
    return [*body_keys(drafter, config, ""),
            ("block_size", config.get("block_size", MISSING), drafter.settings["block_size"]),
            ("mask_token_id", config.get("mask_token_id", MISSING), None),
            ("target_layer_ids (count)", MISSING if ids is MISSING else len(ids),
             ids_implied(drafter)),
            ("markov_rank", config.get("markov_rank", MISSING),
             None if w1 is None else int(w1.shape[1])),
            ("sample_from_anchor", config.get("sample_from_anchor", MISSING), True)]


def dspark_serving(base: str, drafter: str, settings: dict) -> list[ServingSection]:
    """Model card serving sections of DeepSpec's layout: vLLM (`dspark`, the block's B
    proposals), SGLang (`DSPARK`; its draft-token count is B + 1, `dspark_config.py`), llama.cpp
    through `--format gguf`."""
    block = proposals(settings, 1)
    return [vllm_command(base, drafter, "dspark", block),
            ServingSection("SGLang", (
                f"python -m sglang.launch_server --model-path {base} \\",
                f"  --speculative-algorithm DSPARK --speculative-draft-model-path {drafter} \\",
                f"  --speculative-num-draft-tokens {block + 1}"), note=SGLANG_DSPARK_NOTE),
            ServingSection("llama.cpp", note="Not from this folder: `draftsmith export CKPT "
                           "--format gguf` converts the drafter with llama.cpp's own converter "
                           "(`--spec-type draft-dspark`).")]


def dspark_gguf_stage(config: dict, where: str) -> list[int]:
    """llama.cpp's converter (`DSparkModel(DFlashModel)`, arch `dflash`, `--spec-type
    draft-dspark`) reads DeepSpec's layout as written: top-level `target_layer_ids` (0-based
    outputs, adding 1 itself), `mask_token_id`, `block_size` and `sample_from_anchor`, and records
    `dflash.sample_from_anchor` and `dflash.has_confidence_head`. Returns the layer inputs.

    Raises:
        DraftsmithError: a Llama-3 RoPE target, or no layer ids / mask token recorded.
    """
    refuse_llama3_rope(config, where)
    outputs = config.get("target_layer_ids")
    if not outputs or config.get("mask_token_id") is None:
        raise DraftsmithError(f"{where}/config.json records no target_layer_ids or "
                              "mask_token_id (llama.cpp's converter would guess them); re-export "
                              "it with `draftsmith export CKPT --format dspark`")
    return [i + 1 for i in outputs]
