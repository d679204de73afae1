"""The one place that names every export format, and format detection from `config.json`."""

from __future__ import annotations

from draftsmith.errors import DraftsmithError
from draftsmith.export import dflash, dspark, eagle1, eagle3, medusa, mtp, peagle
from draftsmith.export.dflash_llama_cpp import dflash_gguf_stage
from draftsmith.export.record import ExportFormat

FORMATS: dict[str, ExportFormat] = {
    fmt.name: fmt
    for fmt in (
        ExportFormat("eagle3", "eagle3",
                     "EAGLE-3, official / SGLang / SpecForge layout (LlamaForCausalLMEagle3)",
                     eagle3.write_eagle3, eagle3.matches_eagle3, eagle3.read_eagle3,
                     eagle3.eagle3_config_keys, eagle3.eagle3_serving,
                     engines=("sglang", "vllm"), gguf_stage=eagle3.eagle3_gguf_stage),
        ExportFormat("speculators", "eagle3",
                     "EAGLE-3, vllm-project/speculators layout that vLLM serves (Eagle3DraftModel)",
                     eagle3.write_speculators, eagle3.matches_speculators, eagle3.read_speculators,
                     eagle3.speculators_config_keys, eagle3.speculators_serving,
                     library_name="speculators", engines=("vllm",),
                     gguf_stage=eagle3.eagle3_gguf_stage),
        ExportFormat("eagle", "eagle1", "EAGLE-1/2, SafeAILab/EAGLE layout (fc + layers.0)",
                     eagle1.write_eagle, eagle1.matches_eagle, eagle1.read_eagle,
                     eagle1.eagle_config_keys, eagle1.eagle_serving,
                     engines=("sglang", "vllm")),
        ExportFormat("medusa", "medusa",
                     "Medusa heads, FasterDecoding/Medusa layout (medusa_lm_head.safetensors)",
                     medusa.write_medusa, medusa.matches_medusa, medusa.read_medusa,
                     medusa.medusa_config_keys, medusa.medusa_serving, engines=("vllm",),
                     not_served_in={"vllm 0.33.0": "vLLM 0.33 removed Medusa"}),
        ExportFormat("mtp", "mtp", "MTP modules, DeepSeek-V3 layout (model.layers.{N+k}.*)",
                     mtp.write_mtp, mtp.matches_mtp, mtp.read_mtp, mtp.mtp_config_keys,
                     mtp.mtp_serving),
        ExportFormat("dflash", "dflash",
                     "DFlash, native z-lab layout that vLLM (dflash), SGLang (DFLASH) and "
                     "llama.cpp's converter load (DFlashDraftModel)",
                     dflash.write_dflash, dflash.matches_dflash, dflash.read_dflash,
                     dflash.dflash_config_keys, dflash.dflash_serving,
                     engines=("sglang", "vllm"), gguf_stage=dflash_gguf_stage),
        ExportFormat("dflash-speculators", "dflash",
                     "DFlash, vllm-project/speculators layout (DFlashSpeculator)",
                     dflash.write_dflash_speculators, dflash.matches_dflash_speculators,
                     dflash.read_dflash_speculators, dflash.dflash_speculators_config_keys,
                     dflash.dflash_speculators_serving, library_name="speculators",
                     engines=("vllm",), gguf_stage=dflash_gguf_stage),
        ExportFormat("dspark", "dspark",
                     "DSpark, deepseek-ai/DeepSpec layout that vLLM serves (Qwen3DSparkModel)",
                     dspark.write_dspark, dspark.matches_dspark, dspark.read_dspark,
                     dspark.dspark_config_keys, dspark.dspark_serving,
                     engines=("sglang", "vllm"),
                     not_served_in={"vllm 0.32.0": "the CPU build runs model runner V1; vLLM "
                                    "implements DSpark only in its V2 GPU model runner "
                                    "(config/vllm.py refuses it: measured here)"},
                     gguf_stage=dspark.dspark_gguf_stage),
        ExportFormat("peagle", "peagle",
                     "P-EAGLE, vLLM's eagle3 layout with mask_hidden and the parallel-drafting "
                     "keys (LlamaForCausalLMEagle3, served with parallel_drafting: true)",
                     peagle.write_peagle, peagle.matches_peagle, peagle.read_peagle,
                     peagle.peagle_config_keys, peagle.peagle_serving, engines=("vllm",)),
        ExportFormat("peagle-speculators", "peagle",
                     "P-EAGLE, vllm-project/speculators layout (PEagleSpeculator)",
                     peagle.write_peagle_speculators, peagle.matches_peagle_speculators,
                     peagle.read_peagle_speculators, peagle.peagle_speculators_config_keys,
                     peagle.peagle_serving, library_name="speculators", engines=("vllm",)),
    )
}

# Detection order: the explicit markers first, the weight-name guess (EAGLE-1) last.
DETECTION_ORDER = ("speculators", "dflash-speculators", "peagle-speculators", "medusa", "mtp",
                   "dspark", "dflash", "peagle", "eagle3", "eagle")


def get_format(name: str) -> ExportFormat:
    """Raises DraftsmithError for an unknown name, listing the formats."""
    if name not in FORMATS:
        raise DraftsmithError(f"unknown export format {name!r}; choose one of: {', '.join(FORMATS)}")
    return FORMATS[name]


def formats_for_kind(kind: str) -> list[str]:
    return [name for name, fmt in FORMATS.items() if fmt.kind == kind]


def gguf_source_format(kind: str) -> ExportFormat:
    """The layout `--format gguf` exports a `kind` drafter in before llama.cpp's converter reads
    it: the kind's first format with a `gguf_stage`.

    Raises:
        DraftsmithError: no format of the kind is converted, naming the kinds that are.
    """
    for fmt in FORMATS.values():
        if fmt.kind == kind and fmt.gguf_stage is not None:
            return fmt
    kinds = sorted({fmt.kind for fmt in FORMATS.values() if fmt.gguf_stage is not None})
    raise DraftsmithError(f"no {kind} layout is converted to a llama.cpp draft GGUF (its format "
                          f"entries carry no gguf_stage); --format gguf holds {' / '.join(kinds)} "
                          f"drafters; use --format {' or '.join(formats_for_kind(kind))}")


def detect_format(config: dict, names: set[str], where: str) -> ExportFormat:
    """The format of an export folder from its config.json keys and tensor names.

    Raises:
        DraftsmithError: nothing matches (lists what each format is recognised by).
    """
    order = [*DETECTION_ORDER, *(name for name in FORMATS if name not in DETECTION_ORDER)]
    for name in order:
        if FORMATS[name].matches(config, names):
            return FORMATS[name]
    raise DraftsmithError(
        f"{where}: cannot tell the checkpoint format from config.json and the weight names. "
        "Recognised: speculators / dflash-speculators / peagle-speculators "
        "(speculators_model_type), peagle (an eagle3 layout with mask_hidden), medusa "
        "(medusa_num_heads), mtp (num_nextn_predict_layers or *.eh_proj.weight), dspark "
        "(Qwen3DSparkModel or markov_head.*), dflash (DFlashDraftModel), eagle3 "
        "(LlamaForCausalLMEagle3 or midlayer.*), eagle (fc.weight + layers.0.*)")
