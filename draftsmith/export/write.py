"""`draftsmith export`: a trained drafter folder -> what a serving engine loads: a folder layout
(`folder_export.py`) or, for `gguf`, one llama.cpp draft file (`gguf_export.py`)."""

from __future__ import annotations

from pathlib import Path

from draftsmith.export.folder_export import export_folder
from draftsmith.export.gguf_export import export_gguf
from draftsmith.export.record import ExportOptions


def export_drafter(checkpoint: str | Path, fmt: str, out: str | Path,
                   eval_json: str | Path | None = None,
                   options: ExportOptions | None = None, overwrite: bool = False,
                   target_dir: str | Path | None = None, outtype: str = "f32") -> Path:
    """Export a draftsmith drafter folder.

    Args:
        checkpoint: OUTPUT_DIR/drafter of `draftsmith train`.
        fmt: a name in `FORMATS` that holds the checkpoint's kind, or `gguf`.
        out: folder to create.
        eval_json: eval.json of `draftsmith eval --drafter checkpoint`, for the model card.
        options: base model id, dtype, frozen copies (see ExportOptions).
        overwrite: replace an existing earlier export at `out`.
        target_dir: `gguf` only: the target's Hugging Face folder for llama.cpp's converter
            (default: the training target's, when it is an offline model or a local folder).
        outtype: `gguf` only: the draft's weight type (f32, f16, bf16, q8_0).

    Returns:
        The export folder.

    Raises:
        DraftsmithError: wrong format for the kind, existing output, an eval.json of another
            drafter, a checkpoint inconsistent with its metadata, unservable layer ids, or a
            `--base-model` whose sizes differ from the training target's.
    """
    if fmt == "gguf":  # one converted file for llama.cpp, not a folder layout
        return export_gguf(checkpoint, out, eval_json, options, overwrite, target_dir,
                           outtype=outtype)
    return export_folder(checkpoint, fmt, out, eval_json, options, overwrite)
