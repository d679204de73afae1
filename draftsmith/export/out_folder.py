"""Where an export goes: `OUT.partial` then `OUT`, never over the drafter or its training run,
replacing only an earlier export, and a `--base-model` that is the model the drafter was trained
for."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from draftsmith.drafter_folder import DRAFTER_CONFIG
from draftsmith.errors import DraftsmithError
from draftsmith.export.source import base_model_id

CARD = "README.md"
# What `draftsmith train` writes beside OUTPUT_DIR/drafter (see train/checkpoint.py, loop.py).
TRAINING_RUN_FILES = ("checkpoints", "metrics.jsonl")


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

    from draftsmith.target import offline_models
    from draftsmith.target.source import resolve_source

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
    from draftsmith.target import offline_models

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


