"""The run's held-out evaluation: per-position accuracy against the target's own choices and the
simulated tau it implies, the mean over every process's held-out batches."""

from __future__ import annotations

import torch

from draftsmith.train.loader import to_device
from draftsmith.train.loss_module import LossModule
from draftsmith.train.metrics import simulated_tau


@torch.no_grad()
def evaluate(model: LossModule, batches, accelerator) -> dict:
    """Mean per-position accuracy (against the target's own choices) and simulated tau, over
    every process's held-out batches. Every process reaches the one collective whatever its data
    held (a process without a batch adds nothing), so none waits for one that returned early."""
    from accelerate.utils import gather_object

    model.eval()
    sums: dict[str, float] = {}
    count = 0
    for batch in batches:
        _, metrics = model(to_device(batch, accelerator.device))
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value)
        count += 1
    model.train()
    parts = gather_object([(sums, count)]) if accelerator.num_processes > 1 else [(sums, count)]
    total = sum(n for _, n in parts)
    if not total:
        return {}
    keys = sorted({key for part, _ in parts for key in part})
    means = {k: sum(part.get(k, 0.0) for part, _ in parts) / total for k in keys}
    accs = [means[f"acc_{k}"] for k in range(len(means)) if f"acc_{k}" in means]
    return {**{f"eval/{k}": v for k, v in means.items()}, "eval/simulated_tau": simulated_tau(accs)}
