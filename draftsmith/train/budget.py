"""Training sized by wall-clock: measure this machine's pace as the run goes and keep the total
steps, and with it the learning-rate schedule, inside the budget.

A step count that fits one machine is hours on another (a CPU without native bf16 runs the same
recipe ~10x slower), and a run's first steps say little about its later ones: on a 2-core EPYC
the quickstart's steps 2-4 took 0.45 s on batches of 465-662 tokens and later steps 0.9-1.3 s on
700-1,000. With `train.max_minutes` the loop plans the total after its first steps and then
revises it after every step (`BudgetPlanner`): freely while the schedule can take a new total
without a change in a rate it already used (`StepSchedule.revisable`), and after that only to
end within `RETIME_MARGIN` of the budget, re-timing what is left of the decay.
"""

from __future__ import annotations

import math
from collections import deque

CALIBRATION_STEPS = 4  # steps timed before the first plan (the first one is warm-up)
PACE_WINDOW = 16  # recent steps the pace (padded tokens per second) is measured over, at least
# and, in a long run, the steps of its last PACE_WINDOW_SHARE of the budget (at most
# PACE_WINDOW_MAX): a 90-second burst of other work on the machine, 16 of a 400-minute run's
# steps at 1.5 s, cut its planned total from 14,197 to 9,771 steps (the decay starts at 80% of the
# total, and once started it stays); over 8 minutes such a burst is within the trimmed eighth
PACE_WINDOW_SHARE = 0.02
PACE_WINDOW_MAX = 1024
# share of those steps dropped at each end (a stall, a lucky step) before the mean; at least one
# each once three are measured: a resumed run plans from its first three steps, and the 280-minute
# bench's (1.4, 1.4 and 18 s against 1.6 later) cut its total from 10,679 to 4,775 steps at once
PACE_TRIM = 1 / 8
REVISE_MIN_CHANGE = 0.02  # a revision moves the total by more than this share and one step
COSINE_REVISABLE = 0.5  # cosine's and linear's horizon moves only in this first share of the run
RETIME_MARGIN = 0.05  # past that, the decay is re-timed only to end this close to the budget


def steps_for_budget(seconds_per_step: float, budget_seconds: float, elapsed_seconds: float,
                     done_steps: int, max_steps: int) -> int:
    """Total optimizer steps that fit the budget, given what has run so far.

    Args:
        seconds_per_step: cost of one optimizer step, measured here.
        budget_seconds: the whole run's budget.
        elapsed_seconds: time already spent (and any time set aside, e.g. a final evaluation).
        done_steps: steps already taken.
        max_steps: the ceiling.

    Returns:
        A total in [done_steps + 1, max_steps] (at least one more step, never above the ceiling).
    """
    remaining = max(budget_seconds - elapsed_seconds, 0.0)
    more = math.floor(remaining / max(seconds_per_step, 1e-9))
    return max(done_steps + 1, min(max_steps, done_steps + more))


SCHEDULES = ("cosine", "wsd", "linear", "constant")
DECAYS = {  # the rate at decay progress p in [0, 1]
    "cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p)),
    "wsd": lambda p: 1 - p,
    "linear": lambda p: 1 - p,
}


class StepSchedule:
    """LR factor per optimizer step over a total that may be revised while the run goes.

    Linear warmup, then:
      * `cosine`: cosine decay to zero at the end;
      * `wsd` (warmup-stable-decay): full rate until the last `decay_fraction` of the steps, then
        linear decay to zero (a short run spends most of its steps at the peak rate);
      * `linear`: linear decay from the peak to zero at the end (speculators' scheduler);
      * `constant`: full rate to the end.

    `schedule(step)` is the rate after `step` optimizer steps (LambdaLR's convention). A revision
    (`revise`) moves the total freely while that changes no rate the run has used (`revisable`).
    Later it re-times what is left of the decay instead: from `anchor` = (step, decay progress
    there) the progress runs evenly to 1 at the new total, so the rate goes on from its value,
    without a jump, and still reaches zero at the end.
    """

    def __init__(self, warmup: int, total: int, kind: str = "cosine", decay_fraction: float = 0.2,
                 anchor: tuple[int, float] | None = None):
        if kind not in SCHEDULES:
            raise ValueError(f"schedule {kind!r}: use one of {', '.join(SCHEDULES)}")
        self.warmup = warmup
        self.total = total
        self.kind = kind
        self.decay_fraction = decay_fraction
        self.anchor = anchor

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / max(self.warmup, 1)
        if self.kind == "constant":
            return 1.0
        if self.anchor is not None and step >= self.anchor[0]:
            return DECAYS[self.kind](min(self.progress(step), 1.0))
        if self.kind == "wsd":
            decay_steps = max(1, round(self.decay_fraction * self.total))
            left = self.total - step
            return 1.0 if left > decay_steps else max(left, 0) / decay_steps
        progress = (step - self.warmup) / max(self.total - self.warmup, 1)
        return DECAYS[self.kind](min(progress, 1.0))

    def progress(self, step: int) -> float:
        """How far the decay has gone after `step` steps: 0 before it starts, 1 at the end."""
        if self.anchor is not None and step >= self.anchor[0]:
            at, done = self.anchor
            return done + (1 - done) * (step - at) / max(self.total - at, 1)
        if self.kind == "wsd":
            decay_steps = max(1, round(self.decay_fraction * self.total))
            return min(max((step - self.total + decay_steps) / decay_steps, 0.0), 1.0)
        if self.kind in ("cosine", "linear") and step >= self.warmup:
            return min((step - self.warmup) / max(self.total - self.warmup, 1), 1.0)
        return 0.0

    def _decay_start(self, total: int) -> int:
        """wsd: the first step whose rate decays, for a run of `total` steps."""
        return total - max(1, round(self.decay_fraction * total))

    def revisable(self, step: int) -> bool:
        """Whether the total may still move freely after `step` steps without changing a rate
        the run has used: `constant` always; `wsd` until its decay starts (the stable phase grows
        or shrinks); `cosine` and `linear` during warmup and the first `COSINE_REVISABLE` of the
        run (a later horizon would jump the rate). Past that point the total is fixed, and only a run that
        would miss its budget re-times the rest of the decay (`revise`)."""
        if self.kind == "constant" or step < self.warmup:
            return True
        if self.anchor is not None:
            return False
        if self.kind == "wsd":
            return step < self._decay_start(self.total)
        return step < COSINE_REVISABLE * self.total

    def earliest_total(self, step: int) -> int:
        """The smallest total a revision after `step` steps may set: one more step, and while
        `wsd` is revisable a total whose decay has not started (it starts with the next step at
        the earliest)."""
        total = step + 1
        if self.kind == "wsd" and self.decay_fraction < 1 and self.revisable(step):
            total = max(total, math.floor((step - 1) / (1 - self.decay_fraction)))  # <= it
            while self._decay_start(total) <= step:
                total += 1
        return total

    def revise(self, step: int, total: int) -> None:
        """Set a new total after `step` steps: the horizon moves while `revisable` and the total is
        not below `earliest_total`; else the rest of the decay is re-timed from the rate at `step`
        (see the class docstring): a run whose budget ends before its decay could start decays
        from where it is to zero at `total`."""
        if not self.revisable(step) or total < self.earliest_total(step):
            self.anchor = (step, self.progress(step))
        self.total = total


def revised_total(schedule: StepSchedule, step: int, wanted: int, first: bool,
                  seconds_per_step: float, budget_seconds: float) -> int | None:
    """The total a plan after `step` steps sets when the budget wants `wanted`, or None to keep
    the schedule's.

    The first plan sets it (never below `earliest_total`). Later, while the schedule is
    `revisable`, a revision to a total at or above `earliest_total` moves it by more than
    `REVISE_MIN_CHANGE` of it and more than one step. Otherwise (the total is fixed, or the budget
    ends before a decay could start) the total changes only when keeping it would end the run
    more than `RETIME_MARGIN` of the budget away from it, and the decay is re-timed to end there:
    a budget is not stretched to fit a schedule (at 25 s per step, Muon's emulated bf16 on an AVX2
    CPU, stretching a 12-step run to keep its stable phase added 9 steps to a 6-minute budget).
    """
    earliest = schedule.earliest_total(step)
    if first:
        return max(wanted, earliest)
    new = max(wanted, step + 1)
    if schedule.revisable(step) and new >= earliest:
        moved = abs(new - schedule.total) > max(1, REVISE_MIN_CHANGE * schedule.total)
    else:
        moved = abs(new - schedule.total) * seconds_per_step > RETIME_MARGIN * budget_seconds
    return new if moved else None


class BudgetPlanner:
    """A run's total steps from its budget and the pace measured as it goes.

    The loop reports every optimizer step (`record`): when it ended on the run's clock, its padded
    tokens (what a step computes on) and whether an evaluation or a checkpoint ran just before it.
    The pace is padded tokens per second over the last `PACE_WINDOW` steps, or the steps of the
    last `PACE_WINDOW_SHARE` of the budget where they are more (recent, so a machine that slows
    down is seen within a few steps or minutes), the slowest and fastest eighth of them left out
    (at least one of each from three steps on: one stall of a busy machine is not a new pace; a
    lasting change moves the rest). A step's expected cost is the mean padded tokens of every step
    so far (the long-run load, as batches vary) at that pace, plus the time evaluations and
    checkpoints took beyond it, spread over the steps. The total is what fits the budget left after
    the final evaluation (`plan`).

    Args:
        budget_seconds: `train.max_minutes` in seconds.
        max_steps: the ceiling (`train.max_steps`).
        spent_before: seconds the run spent before this process resumed it (the budget holds
            across a resume).
    """

    def __init__(self, budget_seconds: float, max_steps: int, spent_before: float = 0.0):
        self.budget_seconds = budget_seconds
        self.max_steps = max_steps
        self.spent_before = spent_before
        self.window: deque[tuple[int, float]] = deque()  # (tokens, seconds) per recent step
        self.window_seconds = 0.0
        self.steps = 0
        self.tokens = 0
        self.pause_seconds = 0.0  # evaluations and checkpoints, beyond the steps' own cost
        self.last_end: float | None = None

    def record(self, end: float, padded_tokens: int, after_pause: bool) -> None:
        """One optimizer step ended at `end` (seconds on this process's run clock).

        Args:
            end: the clock when the step ended.
            padded_tokens: tokens of its batches, padding included.
            after_pause: an evaluation or a checkpoint ran between this step and the one before
                (that time is counted apart from the pace).
        """
        self.steps += 1
        self.tokens += padded_tokens
        if self.last_end is not None:  # the first step's time holds the setup: not a pace
            seconds = end - self.last_end
            rate = self.tokens_per_second()
            if not after_pause or not self.ready():  # until a plan can be made (every step
                self._measure(padded_tokens, seconds)  # may pause: a checkpoint per step), a
            else:  # paused step's time is its cost
                self.pause_seconds += max(seconds - padded_tokens / rate, 0.0)
        self.last_end = end

    def _measure(self, padded_tokens: int, seconds: float) -> None:
        """Add a step to the pace's window; drop the oldest beyond `PACE_WINDOW` steps while the
        rest still span `PACE_WINDOW_SHARE` of the budget (or exceed `PACE_WINDOW_MAX`)."""
        self.window.append((padded_tokens, seconds))
        self.window_seconds += seconds
        span = PACE_WINDOW_SHARE * self.budget_seconds
        while len(self.window) > PACE_WINDOW and (
                len(self.window) > PACE_WINDOW_MAX
                or self.window_seconds - self.window[0][1] >= span):
            self.window_seconds -= self.window.popleft()[1]

    def ready(self) -> bool:
        """Enough steps measured to plan (the same answer on every process)."""
        return len(self.window) >= CALIBRATION_STEPS - 1

    def tokens_per_second(self) -> float | None:
        """Padded tokens per second over the recent steps, the trimmed mean of their seconds per
        token (None before any)."""
        per_token = sorted(s / max(t, 1) for t, s in self.window)
        trim = max(int(len(per_token) * PACE_TRIM), 1 if len(per_token) >= 3 else 0)
        kept = per_token[trim: len(per_token) - trim]
        mean = sum(kept) / len(kept) if kept else 0.0
        return 1 / mean if mean > 0 else None

    def seconds_per_step(self) -> float:
        """The expected cost of a coming step (see the class docstring)."""
        rate = self.tokens_per_second()
        load = self.tokens / max(self.steps, 1)
        return (load / rate if rate else 0.0) + self.pause_seconds / max(self.steps, 1)

    def plan(self, step: int, clock: float, final_steps: float) -> int:
        """The total that fits the budget after `step` steps at `clock` on this process's clock.

        Args:
            step: optimizer steps done.
            clock: seconds since this process started the run.
            final_steps: what the final evaluation costs, in steps.
        """
        per_step = self.seconds_per_step()
        elapsed = self.spent_before + clock + final_steps * per_step
        return steps_for_budget(per_step, self.budget_seconds, elapsed, step, self.max_steps)


def budget_extendable(progress: dict, then: dict, now: dict) -> bool:
    """Whether a resume may set another `train.max_minutes` (and `train.max_steps`, its
    ceiling): the run and this resume both have a budget, the total was still being planned when
    the checkpoint was written, and the schedule could take a new total at its step without
    changing a rate it used (`StepSchedule.revisable`: wsd's stable phase, cosine's first half,
    constant). The planner then sizes the rest to the new budget, minutes spent before included,
    as a revision within the run would: a 70-minute run resumed from a checkpoint in its stable
    phase with 140 minutes trains on at the peak rate and decays at the new end."""
    if then.get("train.max_minutes") is None or now.get("train.max_minutes") is None \
            or progress.get("planned", True):
        return False
    anchor = (progress.get("budget") or {}).get("anchor")
    try:
        schedule = StepSchedule(int(then["train.warmup_steps"]), progress["total_steps"],
                                then["train.schedule"], float(then["train.decay_fraction"]),
                                tuple(anchor) if anchor else None)
    except (KeyError, TypeError, ValueError):
        return False
    return schedule.revisable(progress["step"])
