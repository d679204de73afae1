"""`draftsmith export`'s one entry, `export_drafter`: a trained drafter folder -> what a serving
engine loads, either a folder layout (every name in `FORMATS`: config.json, safetensors weights,
the training metadata and a model card) or, for `gguf`, one llama.cpp draft file beside the
metadata and card (`gguf.py`: the target folder, the staging and llama.cpp's converter).

Every export is written to `OUT.partial` and renamed when complete; a folder export is first read
back with `load.py` and every tensor compared with the checkpoint's, so a layout bug fails here
rather than in a serving engine.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from draftsmith.drafter_folder import DRAFTER_CONFIG
from draftsmith.errors import DraftsmithError
from draftsmith.export import gguf
from draftsmith.export.card import model_card, read_eval
from draftsmith.export.formats import formats_for_kind, get_format, gguf_source_format
from draftsmith.export.load import CONFIG, read_exported
from draftsmith.export.out_folder import CARD, check_base_model, check_out_folder, partial_folder
from draftsmith.export.record import ExportedDrafter, ExportOptions
from draftsmith.export.source import base_model_id, cast_floats, read_checkpoint
from draftsmith.export.validate import check_config_keys, check_export_fits_target
from draftsmith.export.weights import read_json
from draftsmith.files import write_json
from draftsmith.llama_cpp.convert import OUTTYPES
from draftsmith.registry import get_spec, served_by


def export_drafter(checkpoint: str | Path, fmt: str, out: str | Path,
                   eval_json: str | Path | None = None,
                   options: ExportOptions | None = None, overwrite: bool = False,
                   target_dir: str | Path | None = None, outtype: str = "f32",
                   log: Callable[[str], None] = print) -> Path:
    """Export a draftsmith drafter folder: the one way every caller writes an export.

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
        log: `gguf` only: where the converter's progress lines go.

    Returns:
        The export folder.

    Raises:
        DraftsmithError: wrong format for the kind, existing output, an eval.json of another
            drafter, a checkpoint inconsistent with its metadata, unservable layer ids, a
            `--base-model` whose sizes differ from the training target's; for `gguf` also a
            drafter llama.cpp does not serve, no target folder or one of another model, an
            unknown outtype, or the converter failing (its log's tail quoted).
    """
    if fmt == "gguf":  # one converted file for llama.cpp, not a folder layout
        return _export_gguf(checkpoint, out, eval_json, options, overwrite, target_dir, log,
                            outtype)
    return _export_folder(checkpoint, fmt, out, eval_json, options, overwrite)


def _export_folder(checkpoint: str | Path, fmt: str, out: str | Path,
                   eval_json: str | Path | None = None, options: ExportOptions | None = None,
                   overwrite: bool = False) -> Path:
    """`export_drafter` in a folder format (a name in `FORMATS`)."""
    options = options or ExportOptions()
    ckpt = read_checkpoint(checkpoint)
    export_format = get_format(fmt)
    if export_format.kind != ckpt.kind:
        raise DraftsmithError(f"--format {fmt} holds {export_format.kind} drafters but "
                              f"{ckpt.folder} is a {ckpt.kind} drafter; use --format "
                              f"{' or '.join(formats_for_kind(ckpt.kind))}")
    eval_payload = read_eval(eval_json, ckpt.meta) if eval_json else None
    out = Path(out)
    check_out_folder(out, overwrite, source=ckpt.folder)
    if ckpt.meta.get("lora") and not (ckpt.folder / "lora").is_dir():
        raise DraftsmithError(f"{ckpt.folder} was trained with LoRA (Medusa-2) but has no lora/ "
                              "adapter folder to export with it")
    if options.base_model:
        check_base_model(options.base_model, ckpt, options.allow_base_model_mismatch)
    base = options.base_model or base_model_id(ckpt.meta.get("target"))
    if base is None:
        warnings.warn(f"the training target {ckpt.meta.get('target')!r} is not a Hub id; pass "
                      "--base-model ORG/NAME so the configs and the model card name the target",
                      stacklevel=2)
    tmp = partial_folder(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_json(tmp / CONFIG, export_format.write(ckpt, tmp, options))
    meta = {**ckpt.meta, "export": {"format": export_format.name, "base_model": base}}
    write_json(tmp / DRAFTER_CONFIG, meta)
    if ckpt.meta.get("lora"):
        shutil.copytree(ckpt.folder / "lora", tmp / "lora")
    written = _check_round_trip(ckpt, tmp, options)
    files = {p.relative_to(tmp).as_posix(): p.stat().st_size
             for p in sorted(tmp.rglob("*")) if p.is_file()}
    # the card's serving commands also see what the weights say and the settings do not record
    # (an EAGLE-1 drafter trained before `fc_bias` existed has a trained bias)
    card_meta = {**meta, "drafter_config": {**written.settings,
                                            **(meta.get("drafter_config") or {})}}
    (tmp / CARD).write_text(model_card(card_meta, export_format, base, files, eval_payload))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def _check_round_trip(ckpt, folder: Path, options: ExportOptions) -> ExportedDrafter:
    """Read the export back: it must fit the recorded target and hold the checkpoint's tensors.
    Returns the drafter read back."""
    drafter, _ = read_exported(folder)
    check_export_fits_target(drafter, ckpt.target_config, str(folder))
    check_config_keys(drafter, read_json(folder / CONFIG), str(folder),
                      get_format(drafter.format))
    original = cast_floats(ckpt.tensors, options.dtype)
    for name, value in drafter.state.items():
        if name in original and not torch.equal(value, original[name]):
            raise DraftsmithError(f"export to {folder}: tensor {name} changed in the round trip "
                                  "(a draftsmith bug; please report it)")
    return drafter


def _export_gguf(checkpoint: str | Path, out: str | Path, eval_json: str | Path | None,
                 options: ExportOptions | None, overwrite: bool, target_dir: str | Path | None,
                 log: Callable[[str], None], outtype: str) -> Path:
    """`export_drafter` as `gguf`: `out/draft-eagle3.gguf` (or `draft-dflash.gguf`,
    `draft-dspark.gguf`), `draftsmith_drafter.json` and a model card; the drafter is first
    exported in its kind's `gguf_source_format` (read back and compared as every folder export),
    then staged and converted (`gguf.convert_to_gguf`)."""
    options = options or ExportOptions()
    ckpt = read_checkpoint(checkpoint)
    if "llama.cpp" not in get_spec(ckpt.kind).engine_methods:
        raise DraftsmithError(f"--format gguf holds {' / '.join(served_by('llama.cpp'))} drafters "
                              f"(those llama.cpp serves) but {ckpt.folder} is a {ckpt.kind} "
                              "drafter; use --format "
                              f"{' or '.join(formats_for_kind(ckpt.kind))}")
    spec = get_spec(ckpt.kind)
    unserved = spec.unserved_by(spec.make_config(ckpt.meta.get("drafter_config") or {}))
    if "llama.cpp" in unserved:
        raise DraftsmithError(f"--format gguf: {ckpt.folder}: {unserved['llama.cpp']}")
    if outtype not in OUTTYPES:
        raise DraftsmithError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    name = gguf.gguf_name(spec.engine_methods["llama.cpp"])
    out = Path(out)
    check_out_folder(out, overwrite, source=ckpt.folder)
    if options.base_model:
        check_base_model(options.base_model, ckpt, options.allow_base_model_mismatch)
    eval_payload = read_eval(eval_json, ckpt.meta) if eval_json else None
    hf_dir = gguf.target_hf_dir(ckpt.meta.get("target"), target_dir)
    gguf.check_target_sizes(ckpt.meta, hf_dir)
    tmp = partial_folder(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=tmp.parent) as scratch:
        staged = _export_folder(checkpoint, gguf_source_format(ckpt.kind).name,
                                Path(scratch) / "staged", options=options)
        gguf.convert_to_gguf(staged, hf_dir, tmp / name, log, outtype)
    base = options.base_model or base_model_id(ckpt.meta.get("target"))
    meta = {**ckpt.meta, "export": {"format": "gguf", "base_model": base, "file": name,
                                    "outtype": outtype}}
    write_json(tmp / DRAFTER_CONFIG, meta)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    (tmp / CARD).write_text(model_card(meta, gguf.gguf_format(ckpt.kind), base, files, eval_payload))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out
