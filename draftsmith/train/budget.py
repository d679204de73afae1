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


SCHEDULES = ("cosine", "wsd", "constant")


class StepSchedule:
    """LR factor per optimizer step over a total that can be fixed after the run starts.

    Linear warmup, then:
      * `cosine`: cosine decay to zero at the end;
      * `wsd` (warmup-stable-decay): full rate until the last `decay_fraction` of the steps, then
        linear decay to zero (a short run spends most of its steps at the peak rate);
      * `constant`: full rate to the end.
    """

    def __init__(self, warmup: int, total: int, kind: str = "cosine", decay_fraction: float = 0.2):
        if kind not in SCHEDULES:
            raise ValueError(f"schedule {kind!r}: use one of {', '.join(SCHEDULES)}")
        self.warmup = warmup
        self.total = total
        self.kind = kind
        self.decay_fraction = decay_fraction

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / max(self.warmup, 1)
        if self.kind == "constant":
            return 1.0
        if self.kind == "wsd":
            decay_steps = max(1, round(self.decay_fraction * self.total))
            left = self.total - step
            return 1.0 if left > decay_steps else max(left, 0) / decay_steps
        progress = (step - self.warmup) / max(self.total - self.warmup, 1)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
