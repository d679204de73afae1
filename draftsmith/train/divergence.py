"""Stopping a run that diverged: a non-finite loss ends training at once, and no checkpoint or
drafter is written with NaN or infinite weights, so the last checkpoint on disk is the last good
state. Both checks give every process the same answer (the loss is the mean over processes; the
weights' verdict is reduced), so the processes stop together instead of one waiting forever."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.train.checkpoint import latest_checkpoint


def check_loss(loss: float, step: int, cfg, out_dir: Path) -> None:
    """Raise when the step's loss (mean over processes) is NaN or infinite.

    Raises:
        DraftsmithError: naming the step, what was kept, and the fixes.
    """
    if not math.isfinite(loss):
        raise DraftsmithError(_diverged(f"the loss is {loss} at step {step}", cfg, out_dir))


def check_weights(accelerator, module: torch.nn.Module, step: int, cfg, out_dir: Path) -> None:
    """Before a checkpoint or the drafter is written: every trainable parameter is finite on
    every process (one reduction, one host read).

    Raises:
        DraftsmithError: some process holds a NaN or infinite weight, on every process.
    """
    local = [p for p in module.parameters() if p.requires_grad]
    bad = sum(int(not torch.isfinite(p.detach()).all()) for p in local) if local else 0
    flag = torch.tensor([bad], device=accelerator.device)
    if accelerator.num_processes > 1:
        flag = accelerator.reduce(flag, "sum")
    if int(flag[0]):
        raise DraftsmithError(_diverged(f"the drafter's weights hold NaN or infinite values after "
                                        f"step {step}", cfg, out_dir))


def _diverged(what: str, cfg, out_dir: Path) -> str:
    last = latest_checkpoint(out_dir)
    kept = f"the last checkpoint, {last}, is kept" if last else "no checkpoint was saved before it"
    lrs = f"train.lr={cfg.lr:g}" + (f", train.muon_lr={cfg.muon_lr:g}" if cfg.muon_lr else "")
    return (f"train: {what}: training diverged and stopped; nothing was saved after it and no "
            f"drafter was written ({kept}). Lower the learning rate ({lrs}) or raise "
            "train.warmup_steps; with train.features=offline, damaged cached features give "
            "non-finite losses too: rebuild the cache with `draftsmith data run`")
