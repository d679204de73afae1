"""Training sized by wall-clock: measure seconds per step on this machine, then fix the total.

A step count that fits one machine is hours on another (a CPU without native bf16 runs the same
recipe ~10x slower). With `train.max_minutes` the loop times its first steps and sets the run's
total steps, and with it the learning-rate schedule, so that the run ends inside the budget.
"""

from __future__ import annotations

import math

CALIBRATION_STEPS = 4  # steps timed before the total is fixed (the first one is warm-up)


def steps_for_budget(seconds_per_step: float, budget_seconds: float, elapsed_seconds: float,
                     done_steps: int, max_steps: int) -> int:
    """Total optimizer steps that fit the budget, given what has run so far.

    Args:
        seconds_per_step: steady-state cost of one optimizer step, measured here.
        budget_seconds: the whole loop's budget.
        elapsed_seconds: time already spent (including the calibration steps).
        done_steps: steps already taken.
        max_steps: the recipe's ceiling.

    Returns:
        A total in [done_steps + 1, max_steps] (at least one more step, never above the ceiling).
    """
    remaining = max(budget_seconds - elapsed_seconds, 0.0)
    more = math.floor(remaining / max(seconds_per_step, 1e-9))
    return max(done_steps + 1, min(max_steps, done_steps + more))


class StepSchedule:
    """Linear warmup then cosine decay to zero over a total that can be fixed after it starts."""

    def __init__(self, warmup: int, total: int):
        self.warmup = warmup
        self.total = total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / max(self.warmup, 1)
        progress = (step - self.warmup) / max(self.total - self.warmup, 1)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
