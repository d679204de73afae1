"""`draftsmith export`: a trained drafter folder -> a folder a serving engine loads, with its
config.json, safetensors weights, the training metadata and a model card.

The export is written to `OUT.partial` and renamed when complete; before the rename it is read
back with `load.py` and every tensor is compared with the checkpoint's, so a layout bug fails
here rather than in a serving engine.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch

from draftsmith.drafter_folder import DRAFTER_CONFIG
from draftsmith.errors import DraftsmithError
from draftsmith.export.card import model_card, read_eval
from draftsmith.export.formats import formats_for_kind, get_format
from draftsmith.export.load import CONFIG, read_exported
from draftsmith.export.record import ExportOptions
from draftsmith.export.source import base_model_id, cast_floats, read_checkpoint
from draftsmith.export.validate import check_config_keys, check_export_fits_target
from draftsmith.export.weights import read_json
from draftsmith.files import write_json

CARD = "README.md"
# What `draftsmith train` writes beside OUTPUT_DIR/drafter (see train/checkpoint.py, loop.py).
TRAINING_RUN_FILES = ("checkpoints", "metrics.jsonl")


def export_drafter(checkpoint: str | Path, fmt: str, out: str | Path,
                   eval_json: str | Path | None = None,
                   options: ExportOptions | None = None, overwrite: bool = False,
                   target_dir: str | Path | None = None) -> Path:
    """Export a draftsmith drafter folder.

    Args:
        checkpoint: OUTPUT_DIR/drafter of `draftsmith train`.
        fmt: a name in `FORMATS` that holds the checkpoint's kind.
        out: folder to create.
        eval_json: eval.json of `draftsmith eval --drafter checkpoint`, for the model card.
        options: base model id, dtype, frozen copies (see ExportOptions).
        overwrite: replace an existing non-empty `out`.
        target_dir: `gguf` only: the target's Hugging Face folder for llama.cpp's converter
            (default: the training target's, when it is an offline model or a local folder).

    Returns:
        The export folder.

    Raises:
        DraftsmithError: wrong format for the kind, existing output, an eval.json of another
            drafter, a checkpoint inconsistent with its metadata, unservable layer ids, or a
            `--base-model` whose sizes differ from the training target's.
    """
    if fmt == "gguf":  # one converted file for llama.cpp, not a folder layout
        from draftsmith.export.gguf_export import export_gguf

        return export_gguf(checkpoint, out, eval_json, options, overwrite, target_dir)
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
    _check_round_trip(ckpt, tmp, options)
    files = {p.relative_to(tmp).as_posix(): p.stat().st_size
             for p in sorted(tmp.rglob("*")) if p.is_file()}
    (tmp / CARD).write_text(model_card(meta, export_format, base, files, eval_payload))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def partial_folder(out: Path) -> Path:
    """Where an export to `out` is written before it is renamed to `out` (`OUT.partial`)."""
    return out.with_name(out.name + ".partial")


def is_draftsmith_export(folder: Path) -> bool:
    """True for a folder `draftsmith export` wrote: its `draftsmith_drafter.json` records the
    export (a training output's has no `export` record; a published drafter has no such file)."""
    path = folder / DRAFTER_CONFIG
    try:
        meta = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("export"), dict)


def training_run_of(drafter: Path) -> Path | None:
    """The `draftsmith train` output folder (train.output_dir) a drafter folder sits in: the
    parent of `OUTPUT_DIR/drafter`, or of a drafter beside the run's checkpoints/ or metrics."""
    parent = drafter.parent
    if drafter.name == "drafter" or any((parent / n).exists() for n in TRAINING_RUN_FILES):
        return parent
    return None


def _overlap(path: Path, other: Path) -> str | None:
    """How `path` and `other` (both resolved) overlap: `is`, `is inside`, `holds`, or None."""
    if path == other:
        return "is"
    if path.is_relative_to(other):
        return "is inside"
    if other.is_relative_to(path):
        return "holds"
    return None


def check_out_apart(out: Path, source: Path) -> None:
    """`out` (and `OUT.partial`) must be apart from the drafter folder `source` and its training
    run: an export replaces its folder, so one that is or holds either would delete the trained
    drafter or the run, and one inside the drafter could delete part of it. A new folder inside
    the run (`RUN/export`) is fine: `--force` replaces only an earlier export.

    Raises:
        DraftsmithError: naming both folders and a folder to use instead.
    """
    drafter = source.resolve()
    run = training_run_of(drafter)
    guarded = [(drafter, f"the drafter folder {source}")]
    if run is not None:
        guarded.append((run, f"the training run {run} that {source} belongs to"))
    instead = (run or drafter).parent / f"{(run or drafter).name}-export"
    for path in (out, partial_folder(out)):
        hits = [(overlap, i, what) for i, (folder, what) in enumerate(guarded)
                if (overlap := _overlap(path.resolve(), folder))
                and not (i == 1 and overlap == "is inside")]
        if hits:  # the most telling: `is` first, then inside the drafter, then holding the run
            rank = {"is": 0, "is inside": 1, "holds": 2}
            overlap, _, what = min(hits, key=lambda h: (rank[h[0]], -h[1] if h[0] == "holds"
                                                        else h[1]))
            raise DraftsmithError(
                f"--out {path} {overlap} {what}: an export replaces its --out folder, so it "
                "must stay apart from what training wrote (the drafter and its run). Choose a "
                f"folder outside it, e.g. --out {instead}")


def check_out_folder(out: Path, overwrite: bool, source: Path | None = None) -> None:
    """Check `out` before anything is written or deleted.

    Args:
        out: the export folder to create.
        overwrite: `--force`: replace `out` when it holds a previous draftsmith export.
        source: the drafter folder exported (see `check_out_apart`).

    Raises:
        DraftsmithError: `out` is a file; a non-empty folder without `overwrite`, or one that is
            not a draftsmith export (`--force` replaces only a previous export); or `out` is,
            holds or is inside the drafter folder or its training run.
    """
    if source is not None:
        check_out_apart(out, Path(source))
    if out.exists() and not out.is_dir():
        raise DraftsmithError(f"--out {out} is a file; the export is a folder: choose a folder "
                              "path that does not exist yet")
    if out.exists() and any(out.iterdir()):
        if not is_draftsmith_export(out):
            raise DraftsmithError(
                f"--out {out} exists and is not empty, and is not a draftsmith export (it has no "
                f"{DRAFTER_CONFIG} with an export record): choose another folder; --force "
                "replaces only a previous export, never other files")
        if not overwrite:
            raise DraftsmithError(f"--out {out} exists and is not empty; choose another folder or "
                                  "pass --force to replace the export there")


def _base_model_config(spec: str):
    """The config of `--base-model` (catalog Hub ids read from the fetched offline copy), or None
    with a warning when it cannot be read here (a Hub id without network or cache)."""
    from transformers import AutoConfig

    from draftsmith import offline_models
    from draftsmith.target import resolve_source

    names = [m.name for m in offline_models.CATALOG.values() if spec in (m.name, m.hub_id)]
    if names and offline_models.is_fetched(names[0]):
        spec = names[0]
    try:
        source, kwargs = resolve_source(spec)
        return AutoConfig.from_pretrained(source, **kwargs).get_text_config()
    except (DraftsmithError, OSError, ValueError) as err:
        warnings.warn(f"could not read the config of --base-model {spec!r} ({err}); its sizes are "
                      "not checked against the drafter's training target", stacklevel=3)
        return None


def check_base_model(spec: str, ckpt, allow_mismatch: bool = False) -> None:
    """`--base-model` must name the Hub model the drafter was trained for (when its training
    target has a Hub id; `allow_mismatch` accepts another, e.g. a quantized re-upload), and have
    the hidden size, vocab and layer count it was trained for: the configs and the model card name
    it as the target.

    Raises:
        DraftsmithError: another Hub model than the recorded one (naming both), or a size that
            differs (naming the key and both values).
    """
    from draftsmith import offline_models

    recorded = base_model_id(ckpt.meta.get("target"))
    given = offline_models.CATALOG[spec].hub_id if spec in offline_models.CATALOG else spec
    is_other_hub_model = (recorded is not None and not Path(spec).expanduser().exists()
                          and given.casefold() != recorded.casefold())
    if is_other_hub_model and not allow_mismatch:
        raise DraftsmithError(
            f"--base-model {spec} is another model than the one {ckpt.folder} was trained for: "
            f"{recorded} (training target {ckpt.meta.get('target')!r}). Engines and the model "
            f"card would pair the drafter with a target it never saw. Leave --base-model out to "
            f"use {recorded}, or, when {spec} is the same model under another name (e.g. a "
            "quantized re-upload), pass --allow-base-model-mismatch")
    config = _base_model_config(spec)
    if config is None:
        return
    trained = ckpt.meta["target_config"]
    for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
        value = getattr(config, key, None)
        if value != trained[key]:
            raise DraftsmithError(
                f"--base-model {spec} has {key}={value} but {ckpt.folder} was trained for a target "
                f"with {key}={trained[key]} ({ckpt.meta.get('target')}); pass the Hub id of the "
                "target it was trained on, or leave --base-model out")


def _check_round_trip(ckpt, folder: Path, options: ExportOptions) -> None:
    """Read the export back: it must fit the recorded target and hold the checkpoint's tensors."""
    drafter, _ = read_exported(folder)
    check_export_fits_target(drafter, ckpt.target_config, str(folder))
    check_config_keys(drafter, read_json(folder / CONFIG), str(folder))
    original = cast_floats(ckpt.tensors, options.dtype)
    for name, value in drafter.state.items():
        if name in original and not torch.equal(value, original[name]):
            raise DraftsmithError(f"export to {folder}: tensor {name} changed in the round trip "
                                  "(a draftsmith bug; please report it)")
