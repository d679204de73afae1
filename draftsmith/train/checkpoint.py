"""Checkpoints: resumable training state and the final drafter (safetensors + JSON).

A training-state checkpoint `checkpoints/step_N/` holds the model and optimizer (written by
accelerate: safetensors, and a torch file that is only ever read back as tensors; an FSDP2-sharded
model's sharded by torch.distributed.checkpoint in `sharded/`, `sharded_state.py`), each process's
random generator states (safetensors) and `progress.json`: the step, the run's total steps, the
scheduler's position, the wall-clock budget's state (`budget`: seconds spent and the planner's
revisions, so a resumed `train.max_minutes` run keeps its total) and the run's record (settings,
target and data fingerprints; see `resume.py`). It is written to `step_N.partial/`, `progress.json` last, and renamed, so a crash
never leaves a checkpoint that looks complete but is not; older checkpoints beyond
`train.keep_checkpoints` are deleted only after a newer one is complete, except a budgeted run's
newest checkpoint from before its decay (`pruned`), which a longer budget resumes from.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.drafter_folder import write_drafter_folder
from draftsmith.errors import DraftsmithError
from draftsmith.files import disk_space_errors
from draftsmith.train.budget import budget_extendable
from draftsmith.train.rng_state import rng_state_file, save_rng_state
from draftsmith.train.target_parts import full_state_dict

PROGRESS = "progress.json"
CHECKPOINT_FORMAT = 2  # 1: accelerate's pickled scheduler state and no run record
_COMPLETE_NAME = re.compile(r"step_(\d+)")


def state_dir(out_dir: Path) -> Path:
    """The folder of a run's training-state checkpoints."""
    return out_dir / "checkpoints"


def complete_checkpoints(out_dir: Path) -> list[Path]:
    """The run's complete checkpoints (`step_N` holding progress.json), oldest first; folders of
    interrupted saves (`step_N.partial`) and other names are not checkpoints."""
    found = []
    for path in state_dir(out_dir).glob("step_*"):
        match = _COMPLETE_NAME.fullmatch(path.name)
        if match and (path / PROGRESS).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete training-state checkpoint, or None."""
    done = complete_checkpoints(out_dir)
    return done[-1] if done else None


def remove_interrupted_saves(out_dir: Path) -> list[Path]:
    """Delete the `*.partial` folders a killed save or deletion left behind; returns them."""
    partial = sorted(state_dir(out_dir).glob("*.partial"))
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return partial


def check_shared_output(accelerator, out_dir: Path) -> None:
    """Several processes write into one checkpoint folder that the main process then renames, so
    every process must see the same `train.output_dir`: one node, or a filesystem all the nodes
    share. Each process leaves a marker there and checks it sees every other's; the verdicts are
    gathered, so all processes go on or all stop together.

    Raises:
        DraftsmithError: some process does not see the others' markers (local disks per node).
    """
    import os

    from accelerate.utils import gather_object

    if accelerator.num_processes == 1:
        return
    rank, world = accelerator.process_index, accelerator.num_processes
    folder = state_dir(out_dir) / ".ranks"
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / f"{rank}-{os.getpid()}"
    mine.write_text(os.uname().nodename)
    names = gather_object([mine.name])  # a barrier too: every marker is written
    seen = all((folder / name).is_file() for name in names)
    verdicts = gather_object([(rank, os.uname().nodename, seen)])
    mine.unlink(missing_ok=True)
    blind = [f"rank {r} on {node}" for r, node, ok in verdicts if not ok]
    if blind:
        raise DraftsmithError(
            f"train.output_dir={out_dir} is not one folder for all {world} processes: "
            f"{', '.join(blind)} cannot see the others' files there (a disk local to each node?). "
            "Checkpoints are written by every process into one folder; put train.output_dir on a "
            "filesystem every node shares (NFS, Lustre, a cloud filesystem)")


def save_state(accelerator, out_dir: Path, step: int, progress: dict,
               keep: int | None = None) -> Path:
    """Write checkpoint `step_N`: model and optimizer (accelerate), every process's random
    generator states, then `progress.json` (the step plus `progress`: total steps, scheduler
    position, the run's record). With `keep`, older complete checkpoints beyond the newest
    `keep` are deleted once this one is complete."""
    final = state_dir(out_dir) / f"step_{step}"
    tmp = final.with_name(final.name + ".partial")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        with disk_space_errors(tmp, "free space there, lower train.keep_checkpoints, or set "
                               "train.output_dir to a disk with room (move its checkpoints "
                               "along to resume)"):
            _save_model_and_optimizer(accelerator, tmp)
            save_rng_state(rng_state_file(tmp, accelerator.process_index))
    except DraftsmithError:  # the disk is full: no half-written checkpoint is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / PROGRESS).write_text(json.dumps(
            {"format": CHECKPOINT_FORMAT, "step": step, **progress}) + "\n")
        if final.exists():
            _remove_checkpoint(final)
        tmp.replace(final)
        if keep:
            for old in pruned(complete_checkpoints(out_dir), keep):
                _remove_checkpoint(old)
    accelerator.wait_for_everyone()
    return final


def _save_model_and_optimizer(accelerator, folder: Path) -> None:
    """An FSDP2-sharded model and its optimizer sharded (DCP: each process its own shards, in
    `sharded/`); else accelerate's files (the model and optimizer once, written by the main
    process), without the pickle of the generators' states that accelerate adds."""
    from draftsmith.train.sharded_state import (
        SHARDED_DIR,
        holds_sharded_model,
        prepared_parts,
        save_sharded_state,
    )

    if holds_sharded_model(accelerator):
        save_sharded_state(folder / SHARDED_DIR, *prepared_parts(accelerator))
        return
    accelerator.save_state(str(folder))
    (folder / f"random_states_{accelerator.process_index}.pkl").unlink(missing_ok=True)


def pruned(checkpoints: list[Path], keep: int) -> list[Path]:
    """The checkpoints (oldest first) that `train.keep_checkpoints: keep` deletes: all but the
    newest `keep`, and but the newest one a longer budget could resume (`budget_extendable`:
    written before the decay) when none of those `keep` is one. A budgeted run's last stable-phase
    checkpoint is what training it on to a longer budget starts from (`kinds.L.extends` in a
    benchmark, or a resume with a larger `train.max_minutes`); without it the run could only be
    trained again."""
    extendable = [path for path in checkpoints if _extendable(path)]
    spared = extendable[-1:]  # among the newest `keep` already, or one older kept with them
    return [path for path in checkpoints[:-keep] if path not in spared]


def _extendable(folder: Path) -> bool:
    try:
        progress = json.loads((folder / PROGRESS).read_text(encoding="utf-8"))
        settings = progress["run"]["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return budget_extendable(progress, settings, settings)


def _remove_checkpoint(path: Path) -> None:
    """Rename to `.removing.partial` first (atomic), so a kill mid-deletion leaves no
    complete-looking checkpoint, then delete."""
    doomed = path.with_name(path.name + ".removing.partial")
    shutil.rmtree(doomed, ignore_errors=True)
    path.replace(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _custom_template(recipe) -> str | None:
    """The text of the recipe's own chat template (None: the tokenizer's), so evaluation renders
    prompts the way the drafter saw them in training."""
    from draftsmith.data.render import resolve_chat_template

    custom = recipe.data.get("chat_template")
    return resolve_chat_template(None, custom) if custom else None


def save_drafter(accelerator, drafter: torch.nn.Module, recipe, target_config, step: int,
                 eval_metrics: dict, out_dir: Path, lora_target=None,
                 target_parameters_per_rank: list[int] | None = None,
                 train_seconds: float | None = None) -> Path:
    """Save the trained drafter's weights, whole (gathered on every rank when FSDP sharded them),
    and what is needed to rebuild and check it; with a LoRA-trained target (Medusa-2) its adapter
    goes to `lora/` (safetensors). `target_parameters_per_rank`: the frozen target's parameter
    elements each process held (FSDP shards them), recorded in the metadata; `train_seconds`: the
    wall-clock budget's seconds spent over every process of the run (resumes and the run it
    extends included), when it had one."""
    from draftsmith.registry import get_spec

    final = out_dir / "drafter"
    state = full_state_dict(drafter)  # FSDP2 shards gathered whole (every rank takes part)
    if accelerator.is_main_process:
        tensors = {k: v.contiguous() for k, v in state.items() if not k.startswith("rotary.")}
        config = recipe.drafter_config
        meta = {
            "kind": recipe.kind,
            "drafter_config": asdict(config),
            "target": recipe.target.name,
            "target_config": target_config.to_dict(),
            "aux_layers": list(get_spec(recipe.kind).aux_layers(target_config.num_hidden_layers,
                                                                config)),
            "training_steps": step,
            "train_seconds": train_seconds,
            "num_processes": accelerator.num_processes,
            "target_parameters_per_rank": target_parameters_per_rank,
            "lora": lora_target is not None,
            "eval": eval_metrics,
            "chat_template": _custom_template(recipe),
            "recipe": recipe.to_dict(),
        }
        write_drafter_folder(final, tensors, meta, lora_target)
    accelerator.wait_for_everyone()
    return final
