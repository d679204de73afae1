"""The `gguf` pseudo-format of a kind llama.cpp serves: what its model card and the engine table
say of it (the serving command), apart from the conversion (`gguf_export.py`), so the card and
the table do not import the converter."""

from __future__ import annotations

from draftsmith.errors import DraftsmithError
from draftsmith.export.record import ExportFormat, ServingSection


def _not_a_folder_format(*_args):
    raise DraftsmithError("a gguf export is one file for llama.cpp, not a folder draftsmith reads; "
                          "evaluate the folder export it was made from")


def _gguf_serving(spec_type: str, label_shift: int | None):
    def serving(base: str, drafter: str, settings: dict | None = None) -> list[ServingSection]:
        block = (settings or {}).get("block_size")
        # a block drafter drafts its whole block (DFlash B - 1, DSpark B), EAGLE-3 a chain
        draft_max = block - 1 + (label_shift or 0) if block else 3
        return [ServingSection("llama.cpp", (
            f"llama-server -m TARGET.gguf -md {gguf_name(spec_type)} --spec-type {spec_type} \\",
            f"  --draft-max {draft_max} --draft-min 0 --draft-p-min 0"),
            "`TARGET.gguf` is the target as GGUF. `draftsmith serve-check` runs this pairing "
            "against llama.cpp's plain decoding and draftsmith's own loop.")]
    return serving


def gguf_name(spec_type: str) -> str:
    """The draft file's name: `draft-eagle3.gguf`, `draft-dflash.gguf`, `draft-dspark.gguf`."""
    return f"{spec_type}.gguf"


def gguf_format(kind: str) -> ExportFormat:
    """The `gguf` pseudo-format of a kind llama.cpp serves (for the model card)."""
    from draftsmith.registry import get_spec

    spec = get_spec(kind)
    spec_type = spec.engine_methods["llama.cpp"]
    return ExportFormat("gguf", kind, f"{spec.title} draft GGUF for llama.cpp (`--spec-type "
                        f"{spec_type}`), converted by llama.cpp's own convert_hf_to_gguf.py",
                        _not_a_folder_format, lambda config, names: False, _not_a_folder_format,
                        serving=_gguf_serving(spec_type,
                                              getattr(spec.build, "label_shift", None)),
                        is_folder=False, engines=("llama.cpp",))
