"""The frozen target one batch ahead (`train.overlap_target`, online features): while the step
trains the drafter on batch i, a second thread runs the target's forward on batch i + 1, and, for
kinds that say what it is (`warm_teacher`: EAGLE-3, P-EAGLE), what their loss reads of the
target's head.

An online step is the target's forward (no gradient) and then the drafter's forward, backward and
optimizer step, one after the other. On a CPU neither half keeps every core busy (kernel builds,
Python between small ops, the optimizer's small products), so the next batch's target work fills
what the drafter's step leaves idle (measured on a 2-core Xeon: benchmarks/train_step, fifth
pass). The features are the same tensors the step would compute itself: the same calls under the
same autocast, only earlier, so the losses and the gradients do not change (`tests/train/test_target_ahead.py`; the scaling recipe gave bitwise the
same losses over 12 steps with it on and off). `extract_features` takes a lock, so an evaluation
in the step never runs the target's hooks beside the thread's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.train.target_parts import holds_whole

AHEAD_KEY = "features_ahead"  # a batch's Future of its features (LossModule.forward reads it)


def check_overlap(setting: bool | None, target, joint: bool) -> None:
    """Raises DraftsmithError for `overlap_target: true` where the target's forward cannot run
    beside the step: a sharded or partly loaded target (its forward gathers across processes,
    in step with every rank) or one trained through LoRA (Medusa-2: the forward is the step's)."""
    if not setting:
        return
    if joint:
        raise DraftsmithError("train.overlap_target=true: this drafter trains the target "
                              "through LoRA (Medusa-2), so the target's forward is part of the "
                              "step and cannot run ahead; remove train.overlap_target")
    if not holds_whole(target):
        raise DraftsmithError("train.overlap_target=true: the target is sharded across the "
                              "processes (FSDP), and its forward gathers each layer from every "
                              "rank in step with the training's own collectives; remove "
                              "train.overlap_target or train without sharding the target")


def features_ahead(batches: Iterable[dict], compute: Callable[[dict], object]
                   ) -> Iterator[dict]:
    """`batches` in order, each with its `compute(batch)` under `AHEAD_KEY` as a Future started
    one batch ahead on a worker thread: batch i + 1's starts before batch i is handed out. An
    error in `compute` is raised where the step reads the Future; leaving early cancels what has
    not started and waits for what has."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="draftsmith-target")
    finished = False
    try:
        pending = None
        for batch in batches:
            future = pool.submit(compute, batch)
            if pending is not None:
                yield pending
            pending = {**batch, AHEAD_KEY: future}
        if pending is not None:
            yield pending
        finished = True
    finally:  # left early: what has not started never will
        pool.shutdown(wait=True, cancel_futures=not finished)


def target_forward(features: Callable[[dict], object], autocast, drafter
                   ) -> Callable[[dict], object]:
    """The function `features_ahead` runs on its thread: `features(batch)` (the batch's online
    features: `loss_module.batch_features`), without gradients, under `autocast()` (a context
    manager; the thread does not inherit the step's), with what the drafter's loss reads of the
    target's head where the drafter says what that is (`warm_teacher`: EAGLE-3's logits over
    the draft vocabulary and the target's choices, P-EAGLE's restricted rows)."""
    warm = getattr(drafter, "warm_teacher", None)

    def compute(batch: dict):
        with torch.no_grad(), autocast():
            computed = features(batch)
            if warm is not None:
                warm(computed)
            return computed

    return compute
