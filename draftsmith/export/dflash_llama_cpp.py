"""DFlash exports as llama.cpp's converter reads them (arch `dflash`, PR #22105), and the RoPE
check DSpark's shares (`draftsmith.export.dspark`).

The converter reads the native layout's `dflash_config.{block_size, mask_token_id,
target_layer_ids}` (0-based outputs, adding 1 itself; block size from `dflash_config` first, then
the top level), takes the tokenizer from the target and writes `dflash.target_layers`,
`dflash.block_size`, `tokenizer.ggml.mask_token_id`; the speculators layout is staged as the
native one. Neither DFlash converter class writes `rope_freqs`, so a drafter of a Llama-3-style
target (rope_type llama3) is refused rather than served with unscaled RoPE.
"""

from __future__ import annotations

from draftsmith.errors import DraftsmithError


def refuse_llama3_rope(config: dict, where: str) -> None:
    """llama.cpp's DFlash / DSpark converter classes (`DFlashModel(Qwen3Model)`, xllamacpp
    2026.10.11549) never write `rope_freqs`, the tensor through which llama.cpp applies Llama-3's
    RoPE scaling (its `dflash` runtime uses it when present), so such a draft would run with
    unscaled RoPE: refused, naming why."""
    body = config.get("transformer_layer_config") or config
    rope = body.get("rope_parameters") or body.get("rope_scaling") or {}
    if (rope.get("rope_type") or rope.get("type")) == "llama3":
        raise DraftsmithError(
            f"{where}: the target uses Llama-3 RoPE scaling (rope_type llama3), which "
            "llama.cpp's DFlash/DSpark GGUF converter (xllamacpp 2026.10.11549) does not carry: it "
            "writes no rope_freqs tensor, so llama.cpp would run the draft with unscaled RoPE. "
            "Serve this drafter with vLLM or SGLang instead (`--format dflash` / `--format "
            "dspark`)")


def dflash_gguf_stage(config: dict, where: str) -> list[int]:
    """The converter reads the native layout (`DFlashDraftModel`, block size and 0-based layer
    outputs under `dflash_config`, adding 1 itself); a speculators-layout config is rewritten into
    it. Returns the layer inputs the GGUF must record.

    Raises:
        DraftsmithError: a Llama-3 RoPE target, a draft vocabulary (the converter drops it), or no
            layer ids / mask token recorded.
    """
    refuse_llama3_rope(config, where)
    body = config.get("transformer_layer_config") or config
    vd, vocab = config.get("draft_vocab_size"), body.get("vocab_size")
    if vd is not None and vocab is not None and vd < vocab:
        from draftsmith.registry import DFLASH_DRAFT_VOCAB_NOT_IN

        raise DraftsmithError(f"{where}: {DFLASH_DRAFT_VOCAB_NOT_IN['llama.cpp']}")
    if config.get("speculators_model_type") == "dflash":
        body = dict(config.get("transformer_layer_config") or {})
        outputs = [i - 1 for i in config.get("aux_hidden_state_layer_ids") or []]
        flags = {"block_size": config.get("block_size"), "mask_token_id": config.get("mask_token_id"),
                 "target_layer_ids": outputs}
        config.clear()
        config.update(body, architectures=["DFlashDraftModel"], block_size=flags["block_size"],
                      dflash_config=flags)
    flags = config.get("dflash_config") or {}
    outputs = flags.get("target_layer_ids")
    if not outputs or flags.get("mask_token_id") is None:
        raise DraftsmithError(f"{where}/config.json records no dflash_config.target_layer_ids "
                              "or mask_token_id (llama.cpp's converter would guess them); "
                              "re-export it with `draftsmith export CKPT --format dflash`")
    return [i + 1 for i in outputs]
