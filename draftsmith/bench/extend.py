"""Benchmark drafters trained on from another drafter's run (`kinds.LABEL.extends: BASE`): the
long end of a scaling curve without training the shared part twice.

A wsd (or constant) run may be extended from any checkpoint written before its decay began: the
rates it used until then are those of a longer run (`train.budget.budget_extendable`). The
extension copies BASE's newest such checkpoint, and its metrics up to it, into its own folder and
resumes it there with its own `budget_minutes` as the whole run's `train.max_minutes` (BASE's
minutes up to that checkpoint included): the drafter one run of that budget would have trained,
one schedule, decaying at the new end. Its recipe is BASE's, with only the budget (and the step
ceiling, when the budget needs more) and the output folder changed; the resume checks the rest.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import yaml

from draftsmith.errors import DraftsmithError
from draftsmith.eval.results import TrainingRecord
from draftsmith.files import write_json
from draftsmith.train.budget import budget_extendable
from draftsmith.train.checkpoint import complete_checkpoints
from draftsmith.train.metrics import metrics_rows
from draftsmith.train.resume import flatten_settings, read_progress


def resolve_extensions(entries: list, path, budget_minutes: float) -> None:
    """Each `extends` names an earlier drafter and sets nothing but its budget, a longer one than
    that drafter's (`budget_minutes`: the benchmark's, for entries without their own); it then
    takes that drafter's recipe and settings (it is the same run, trained on).

    Raises:
        DraftsmithError: naming `kinds.LABEL` and the fix.
    """
    seen = {}
    for entry in entries:
        if entry.extends is not None:
            where = f"{path}: kinds.{entry.label}.extends = {entry.extends!r}"
            if entry.extends not in seen:
                raise DraftsmithError(f"{where} names no drafter listed before it in `kinds` "
                                      f"({', '.join(seen) or 'none'}); list the run it extends "
                                      "first")
            base = seen[entry.extends]
            if entry.drafter or entry.train or entry.data or entry.recipe not in (None,
                                                                                  base.recipe):
                raise DraftsmithError(f"{where}: an extension trains on the same run, so it takes "
                                      "only budget_minutes; drop its recipe, drafter, train and "
                                      "data settings (or train it as a drafter of its own)")
            longer, shorter = (e.budget_minutes or budget_minutes for e in (entry, base))
            if not longer > shorter:
                raise DraftsmithError(f"{where}: its budget_minutes ({longer:g}) must exceed "
                                      f"{base.label}'s ({shorter:g}), whose run it trains on")
            entry.recipe, entry.drafter, entry.train, entry.data = (
                base.recipe, base.drafter, base.train, base.data)
        elif entry.recipe is None:
            raise DraftsmithError(f"{path}: kinds.{entry.label} needs `recipe: FILE` (or "
                                  "`extends: LABEL` to train on from another drafter's run)")
        seen[entry.label] = entry


def extension_recipe(base: TrainingRecord, folder: Path, budget_minutes: float,
                     ceiling_factor: int) -> dict:
    """BASE's recipe (as it trained) for the extension: its own folder and budget, and a step
    ceiling raised (to `ceiling_factor` x the estimate) only when the budget could need more steps
    at BASE's measured pace."""
    raw = yaml.safe_load(Path(base.recipe).read_text())
    train = raw["train"]
    train.update(output_dir=str(folder), max_minutes=budget_minutes)
    needed = math.ceil(budget_minutes * 60 / base.seconds_per_step)
    if needed > train["max_steps"]:
        train["max_steps"] = ceiling_factor * needed
    return raw


def seed_extension(base: TrainingRecord, base_folder: Path, folder: Path, raw: dict, label: str,
                   log=print) -> None:
    """Start the extension's folder from BASE's newest checkpoint written before its decay (the
    checkpoint, its metrics rows up to that step, and its minutes as the first attempt); a folder
    that already holds a checkpoint is an extension under way and is left as it is.

    Raises:
        DraftsmithError: BASE kept no checkpoint (deleted), or none from before its decay.
    """
    if complete_checkpoints(folder):
        return
    now = flatten_settings(json.loads(json.dumps(raw, default=str)))
    kept = complete_checkpoints(base_folder)
    if not kept:
        raise DraftsmithError(
            f"kinds.{label} extends {base.label}, but {base.label}'s run keeps no complete "
            f"checkpoint ({base_folder / 'checkpoints'} is missing or empty: deleted after it "
            "trained?), and an extension resumes that run from one written before its decay. "
            f"Delete {base_folder} so that the benchmark trains {base.label} again (its "
            f"checkpoints kept), or train {label} as a drafter of its own")
    chosen = None
    for checkpoint in reversed(kept):
        progress = read_progress(checkpoint)
        if budget_extendable(progress, progress["run"]["settings"], now):
            chosen = checkpoint, progress
            break
    if chosen is None:
        raise DraftsmithError(
            f"kinds.{label} extends {base.label}, but none of the checkpoints it kept "
            f"({base_folder / 'checkpoints'}) was written before its learning rate began to "
            "decay, so no longer run shares its rates; train it as a drafter of its own, or "
            f"retrain {base.label} with train.keep_checkpoints: 0 (all kept)")
    checkpoint, progress = chosen
    step = progress["step"]
    log(f"{label}: from {base.label}'s step-{step} checkpoint (before its decay), "
        f"{progress['budget']['spent_seconds'] / 60:.1f} minutes in, to "
        f"{raw['train']['max_minutes']:g} minutes in all")
    staging = folder / "checkpoints" / f"step_{step}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(checkpoint, staging)
    rows = metrics_rows(base_folder / "metrics.jsonl", log)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for _, row in rows
                                                  if row["step"] <= step))
    write_json(folder / "attempts.json", [progress["budget"]["spent_seconds"]])
    write_json(folder / "extends.json", {"label": base.label, "step": step,
                                         "minutes": progress["budget"]["spent_seconds"] / 60})
    staging.rename(folder / "checkpoints" / f"step_{step}")
