"""A trained drafter folder -> a folder a serving engine loads (every format but `gguf`), with its
config.json, safetensors weights, the training metadata and a model card.

The export is written to `OUT.partial` and renamed when complete; before the rename it is read
back with `load.py` and every tensor is compared with the checkpoint's, so a layout bug fails
here rather than in a serving engine.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch

from draftsmith.drafter_folder import DRAFTER_CONFIG
from draftsmith.errors import DraftsmithError
from draftsmith.export.card import model_card, read_eval
from draftsmith.export.formats import formats_for_kind, get_format
from draftsmith.export.load import CONFIG, read_exported
from draftsmith.export.out_folder import CARD, check_base_model, check_out_folder, partial_folder
from draftsmith.export.record import ExportedDrafter, ExportOptions
from draftsmith.export.source import base_model_id, cast_floats, read_checkpoint
from draftsmith.export.validate import check_config_keys, check_export_fits_target
from draftsmith.export.weights import read_json
from draftsmith.files import write_json


def export_folder(checkpoint: str | Path, fmt: str, out: str | Path,
                  eval_json: str | Path | None = None,
                  options: ExportOptions | None = None, overwrite: bool = False) -> Path:
    """Export a draftsmith drafter folder in a folder format (see `write.export_drafter`).

    Args:
        checkpoint: OUTPUT_DIR/drafter of `draftsmith train`.
        fmt: a name in `FORMATS` that holds the checkpoint's kind.
        out: folder to create.
        eval_json: eval.json of `draftsmith eval --drafter checkpoint`, for the model card.
        options: base model id, dtype, frozen copies (see ExportOptions).
        overwrite: replace an existing non-empty `out`.

    Returns:
        The export folder.

    Raises:
        DraftsmithError: wrong format for the kind, existing output, an eval.json of another
            drafter, a checkpoint inconsistent with its metadata, unservable layer ids, or a
            `--base-model` whose sizes differ from the training target's.
    """
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
