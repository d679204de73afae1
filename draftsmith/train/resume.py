"""Resuming a run from its newest checkpoint without mixing runs or running code from a file.

A checkpoint records the run it belongs to (`run_record`): the recipe's settings, the target's
fingerprint (config and weights, as the data cache records them), the training data's fingerprint
and the number of processes. A resumed run must match it, except in the settings that only decide
what is logged and written where (`FREE_SETTINGS`), and in its budget while the schedule can
still take a new total (`budget_extendable`: a run extended or cut short from its stable phase);
otherwise it stops before loading anything, naming what changed and the fix. Loading never unpickles anything but tensors and plain values:
every torch file in the folder is first read with `torch.load(weights_only=True)`, a sharded
state's metadata by an unpickler of DCP's metadata classes only (`sharded_state.py`), the
scheduler's position is JSON and the random generators' states are safetensors.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.train.budget import budget_extendable
from draftsmith.train.checkpoint import (
    CHECKPOINT_FORMAT,
    PROGRESS,
    latest_checkpoint,
    remove_interrupted_saves,
)
from draftsmith.train.rng_state import load_rng_state, rng_state_file

# Settings a resumed run may change: what is logged, how often it is saved and where things are.
# The target's and the data's paths may change (a moved folder): their fingerprints are checked.
FREE_SETTINGS = frozenset({
    "train.save_every", "train.eval_every", "train.keep_checkpoints", "train.output_dir",
    "train.wandb", "train.wandb_project", "target.name", "target.trust_remote_code",
    "data.tokenized", "data.out_dir", "train.log_interval", "train.loader_workers",
    "train.overlap_target",
})
# A budgeted run resumed while its schedule can still take a new total may change these
# (`budget_extendable`): the planner re-sizes the rest of the run to the new budget.
BUDGET_SETTINGS = frozenset({"train.max_minutes", "train.max_steps"})
# A setting added with a default that changes what a step computes: a run written before it
# existed ran as this value, not as today's default (token batches arrived after row batches).
BEFORE_ADDED = {"train.batching": "rows"}
_SAFE_SUFFIXES = (".json", ".safetensors")


def examples_sha256(examples: list[dict]) -> str:
    """Fingerprint of the training data: every example's input_ids and loss_mask, in order."""
    digest = hashlib.sha256()
    for example in examples:
        for key in ("input_ids", "loss_mask"):
            values = torch.as_tensor(example[key], dtype=torch.int64).reshape(-1)
            digest.update(values.numel().to_bytes(8, "little"))
            digest.update(values.numpy().tobytes())
    return digest.hexdigest()


def examples_record(examples: list[dict]) -> dict:
    """The data part of `run_record` for in-memory examples."""
    return {"examples": len(examples), "sha256": examples_sha256(examples)}


def run_record(recipe, target, data: dict, num_processes: int) -> dict:
    """What a checkpoint of this run records about it (JSON): settings, target, data (its
    fingerprint: `examples_record`, `CacheStream.fingerprint`), processes."""
    from draftsmith.data.identity import config_sha256, weights_sha256

    settings = json.loads(json.dumps(recipe.to_dict(), default=str))
    return {"settings": flatten_settings(settings),
            "target": {"name": recipe.target.name, "config_sha256": config_sha256(target.config),
                       "weights_sha256": weights_sha256(target)},
            "data": data,
            "num_processes": num_processes}


def flatten_settings(values: dict, prefix: str = "") -> dict:
    """{"train": {"lr": 1}} -> {"train.lr": 1}: nested settings as dotted keys."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            flat.update(flatten_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _train_defaults() -> dict:
    """Every `train.*` setting at its default, flattened as `run_record` writes them."""
    from dataclasses import asdict

    from draftsmith.train.recipe import TrainSection

    return flatten_settings(json.loads(json.dumps({"train": asdict(TrainSection())}, default=str)))


def find_resume_checkpoint(accelerator, out_dir: Path) -> Path | None:
    """The newest complete checkpoint of `out_dir`, after the main process deleted what killed
    saves left behind (`step_N.partial`)."""
    if accelerator.is_main_process:
        removed = remove_interrupted_saves(out_dir)
        if removed:
            accelerator.print(f"removed {len(removed)} interrupted checkpoint save(s): "
                              f"{', '.join(p.name for p in removed)}")
    accelerator.wait_for_everyone()
    return latest_checkpoint(out_dir)


def _start_over(folder: Path) -> str:
    return (f"delete {folder} to resume from an earlier checkpoint, or delete {folder.parent} to "
            "start the run over")


def _stream_ok(stream) -> bool:
    """`data_stream`: where the data was, {"epoch": int >= 0, "batches_done": int >= 0}."""
    return isinstance(stream, dict) and all(
        isinstance(stream.get(k), int) and stream[k] >= 0 for k in ("epoch", "batches_done"))


def read_progress(folder: Path) -> dict:
    """The checked `progress.json` of a checkpoint folder.

    Raises:
        DraftsmithError: not JSON, written by an older draftsmith, or a field is malformed.
    """
    path = folder / PROGRESS
    try:
        progress = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DraftsmithError(f"{path} is not readable JSON ({err}); "
                              f"{_start_over(folder)}") from None
    if not isinstance(progress, dict) or progress.get("format") != CHECKPOINT_FORMAT:
        raise DraftsmithError(
            f"{folder} was written by an older draftsmith: its scheduler state is a pickle and it "
            "records no settings to check this run against, so it is not resumed; delete "
            f"{folder.parent} to start the run over (or finish it with the draftsmith version that "
            "started it)")
    step, total = progress.get("step"), progress.get("total_steps")
    fields_ok = (isinstance(step, int) and isinstance(total, int) and 0 <= step <= total
                 and isinstance(progress.get("planned"), bool)
                 and isinstance(progress.get("scheduler"), dict)
                 and isinstance(progress.get("run"), dict)
                 and _stream_ok(progress.get("data_stream", {"epoch": 0, "batches_done": 0})))
    if not fields_ok:
        raise DraftsmithError(f"{path} lacks or has malformed fields (step, total_steps, planned, "
                              f"scheduler, run, data_stream); {_start_over(folder)}")
    return progress


def check_same_run(folder: Path, progress: dict, record: dict) -> None:
    """Refuse to resume `folder` with other settings, another target, other data or another
    number of processes than the run that wrote it.

    Raises:
        DraftsmithError: naming each difference and how to resume or start a new run.
    """
    saved = progress["run"]
    new_run = (f"or start a new run with another train.output_dir (or delete {folder.parent} to "
               "start this one over)")
    then, now = saved.get("settings") or {}, record["settings"]
    missing = "(unset)"
    # a train setting added since that run was written counts as its default there, or as the
    # value that run behaved as where the new default computes something else
    added = {**_train_defaults(), **BEFORE_ADDED}
    then = {**{k: v for k, v in added.items() if k in now}, **then}
    extendable = budget_extendable(progress, then, now)
    changed = [key for key in changed_settings(then, now)
               if key not in FREE_SETTINGS and not (extendable and key in BUDGET_SETTINGS)]
    if changed:
        differences = setting_differences(then, now, changed, "in that run")
        back = " ".join(f"{key}={_show(then.get(key, missing))}" for key in changed)
        note = (" (a run's learning-rate schedule is fixed by its total steps when it starts)"
                if "train.max_steps" in changed else "")
        if "train.max_minutes" in changed and then.get("train.max_minutes") is not None:
            note += (" (a budget may change on resume only while the schedule can still take a "
                     "new total: before wsd's decay, before cosine's second half, or constant)")
        raise DraftsmithError(f"{folder} belongs to a run with other settings: {differences}"
                              f"{note}; set {back} to resume it, {new_run}")
    target_then, target_now = saved.get("target") or {}, record["target"]
    if any(target_then.get(k) != target_now[k] for k in ("config_sha256", "weights_sha256")):
        raise DraftsmithError(
            f"{folder} was trained against another target ({target_then.get('name')}, weights "
            f"{str(target_then.get('weights_sha256'))[:12]}) than this run's "
            f"({target_now['name']}, weights {target_now['weights_sha256'][:12]}); resume it with "
            f"the target it started with, {new_run}")
    data_then, data_now = saved.get("data") or {}, record["data"]
    if data_then.get("sha256") != data_now["sha256"]:
        same_count = data_then.get("examples") == data_now["examples"]
        raise DraftsmithError(
            f"{folder} was trained on other data than this run's ({data_then.get('examples')} "
            f"examples then, {data_now['examples']} now{', other tokens' if same_count else ''}): "
            f"the data changed since the run started; resume it with the data it started with, "
            f"{new_run}")
    if saved.get("num_processes") != record["num_processes"]:
        raise DraftsmithError(
            f"{folder} was written by a run on {saved.get('num_processes')} process(es) and this "
            f"one has {record['num_processes']}: the global batch and the data position depend on "
            f"it; launch with --num_processes {saved.get('num_processes')} to resume it, "
            f"{new_run}")


def changed_settings(then: dict, now: dict) -> list[str]:
    """The dotted keys whose values differ between two flattened settings (a key one lacks
    counts as unset there)."""
    return [key for key in sorted(set(then) | set(now))
            if then.get(key, "(unset)") != now.get(key, "(unset)")]


def setting_differences(then: dict, now: dict, keys: list[str], there: str) -> str:
    """`key=NOW here but THEN <there>; ...` for `keys` of two flattened settings."""
    return "; ".join(f"{key}={_show(now.get(key, '(unset)'))} here but "
                     f"{_show(then.get(key, '(unset)'))} {there}" for key in keys)


def _show(value) -> str:
    return json.dumps(value) if isinstance(value, (dict, list)) or value is None else str(value)


def verify_torch_files(folder: Path) -> None:
    """Read every file of a checkpoint that is not JSON or safetensors with
    `torch.load(weights_only=True)` (memory-mapped, so cheap) before accelerate reads it: a file
    holding any other pickled object stops the resume and is never unpickled.

    Raises:
        DraftsmithError: naming the file, for pickled objects, damage, or accelerate's custom
            objects (`custom_checkpoint_*.pkl`, which it would unpickle without that guard).
    """
    from draftsmith.train.sharded_state import SHARDED_DIR

    fix = _start_over(folder)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.name.endswith(_SAFE_SUFFIXES) or path.parent == folder / SHARDED_DIR:
            continue  # the sharded state's files are read by `load_sharded_state`'s guards
        if path.suffix == ".distcp" or path.name == ".metadata":
            raise DraftsmithError(f"{path.parent} is a sharded FSDP checkpoint written by "
                                  "accelerate, which reads it by unpickling its metadata "
                                  "unguarded; draftsmith writes sharded state to "
                                  f"{SHARDED_DIR}/ itself; {fix}")
        if path.name.startswith("custom_checkpoint_"):
            raise DraftsmithError(f"{path} is not part of a draftsmith checkpoint (accelerate "
                                  f"would unpickle it, running any code it holds); {fix}")
        try:
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as err:
            found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
            named = f" (it calls {found.group(1)})" if found else ""
            raise DraftsmithError(
                f"{path} holds pickled objects other than tensors{named}; draftsmith never "
                f"unpickles those from a checkpoint (they can run code); {fix}") from None
        except (RuntimeError, OSError, EOFError, ValueError) as err:
            reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
            raise DraftsmithError(f"{path} is damaged or not a torch file ({reason}); "
                                  f"{fix}") from None


def load_checkpoint(accelerator, folder: Path, scheduler, progress: dict) -> None:
    """Restore model, optimizer, scheduler and random generators from a checked checkpoint.

    Raises:
        DraftsmithError: a file is damaged, pickles objects, or does not fit this run.
    """
    from safetensors import SafetensorError

    from draftsmith.train.sharded_state import SHARDED_DIR, load_sharded_state, prepared_parts

    verify_torch_files(folder)
    try:
        if (folder / SHARDED_DIR).is_dir():  # DCP re-shards it to this run's model, as it is
            load_sharded_state(folder / SHARDED_DIR, *prepared_parts(accelerator))
        else:
            accelerator.load_state(str(folder), load_kwargs={"weights_only": True})
    except DraftsmithError as err:
        raise DraftsmithError(f"{err}; {_start_over(folder)}") from None
    except (RuntimeError, ValueError, KeyError, OSError, EOFError, SafetensorError,
            pickle.UnpicklingError) as err:
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise DraftsmithError(f"{folder} does not fit this run's drafter and optimizer or is "
                              f"damaged ({reason}); {_start_over(folder)}") from None
    _restore_scheduler(scheduler, progress["scheduler"], folder)
    load_rng_state(rng_state_file(folder, accelerator.process_index))


def scheduler_state(scheduler) -> dict:
    """The scheduler's position as JSON values (its schedule is rebuilt from the recipe)."""
    return {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}


def _restore_scheduler(scheduler, saved: dict, folder: Path) -> None:
    current = scheduler_state(scheduler)
    common = {k: saved[k] for k in current if k in saved}
    if "last_epoch" not in common or any(type(v) is not type(current[k])
                                         for k, v in common.items()):
        raise DraftsmithError(f"{folder / PROGRESS}: its scheduler state {saved} is malformed; "
                              f"{_start_over(folder)}")
    scheduler.load_state_dict({**common, "lr_lambdas": [None] * len(scheduler.lr_lambdas)})


def resume_run(accelerator, out_dir: Path, record: dict, scheduler, schedule, cfg
               ) -> tuple[int, dict]:
    """Load the run's newest checkpoint, when it has one, into the prepared model, optimizer and
    scheduler, after checking it belongs to this very run (`check_same_run`); a refused resume
    changes nothing.

    Returns:
        (the step to go on from, its progress.json), or (0, {}) for a new run.
    """
    resume = find_resume_checkpoint(accelerator, out_dir)
    if resume is None:
        return 0, {}
    progress = read_progress(resume)
    check_same_run(resume, progress, record)
    load_checkpoint(accelerator, resume, scheduler, progress)
    schedule.total = progress["total_steps"]
    accelerator.print(f"resuming from {resume} at step {progress['step']} of {schedule.total}")
    minutes_then = progress["run"]["settings"].get("train.max_minutes")
    if cfg.max_minutes is not None and minutes_then not in (None, cfg.max_minutes):
        accelerator.print(f"train.max_minutes={cfg.max_minutes:g} (the run started with "
                          f"{minutes_then:g}): the rest of the run is planned to the new "
                          "budget, minutes spent before included")
    return progress["step"], progress


def finished_drafter(out_dir: Path, recipe) -> Path | None:
    """OUTPUT_DIR/drafter when it holds a drafter trained by this very recipe; None when it holds
    no finished drafter.

    Raises:
        DraftsmithError: it holds one trained by another recipe, which a run here would overwrite
            (its weights and its metrics.jsonl), naming the settings that differ.
    """
    path = out_dir / "drafter" / "draftsmith_drafter.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    now, then = json.loads(json.dumps(recipe.to_dict(), default=str)), meta.get("recipe")
    if now == then:
        return path.parent
    if not isinstance(then, dict):
        return None  # written before drafters recorded their recipe
    then, now = flatten_settings(then), flatten_settings(now)
    changed = changed_settings(then, now)
    shown = setting_differences(then, now, changed[:4], "there")
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    raise DraftsmithError(
        f"{path.parent} holds a drafter trained by another recipe ({shown}{more}); training here "
        "would overwrite it and its metrics.jsonl: set another train.output_dir, or delete "
        f"{out_dir} to train this recipe there")
