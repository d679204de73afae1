"""A run's wall-clock budget (`train.max_minutes`) as the loop meets it: the planner that sizes the
run's total from the measured pace, its revisions (the same total on every rank, logged and
printed), the state a checkpoint keeps so a resumed run goes on with it, and the minutes spent
that the drafter records. Without a budget every method is a no-op."""

from __future__ import annotations

import torch

from draftsmith.train.budget import BudgetPlanner, StepSchedule, revised_total


class BudgetClock:
    """The budget part of the loop.

    Args:
        cfg: the recipe's train section.
        schedule: the learning-rate schedule whose total the plans set.
        progress: the resumed checkpoint's progress.json ({} for a new run).
        accelerator: the run's Accelerator (rank 0's measurement decides).
        log: the run's `MetricsLog` (plans are rows of it).
    """

    def __init__(self, cfg, schedule: StepSchedule, progress: dict, accelerator, log):
        self.cfg, self.schedule, self.accelerator, self.log = cfg, schedule, accelerator, log
        self.saved = progress.get("budget") or {}
        # with a budget the total follows the measured pace (`planned`: the total is final); a
        # resumed run starts from its checkpoint's total, schedule and minutes spent
        self.planner = None if cfg.max_minutes is None or progress.get("planned", False) else \
            BudgetPlanner(cfg.max_minutes * 60, cfg.max_steps, self.saved.get("spent_seconds", 0.0))
        self.plans = self.saved.get("plans", 0)  # plans made so far (the first one is always taken)
        if self.saved.get("anchor"):
            schedule.anchor = tuple(self.saved["anchor"])

    def after_step(self, step: int, clock: float, padded_tokens: int, paused: bool,
                   final_steps: float) -> bool:
        """Record an optimizer step that ended at `clock` and plan or revise the total once the
        pace is known. Returns whether the total changed."""
        if self.planner is None:
            return False
        revisable = self.schedule.revisable(step)
        self.planner.record(clock, padded_tokens, paused)
        changed = self.planner.ready() and step < self.schedule.total and \
            self._plan_total(step, clock, final_steps)
        if changed:
            self.plans += 1
        if self.plans and revisable and not self.schedule.revisable(step):
            self.accelerator.print(
                f"train.max_minutes={self.cfg.max_minutes:g}: {self.schedule.total} steps from "
                f"step {step} on ({self.cfg.schedule}: a new total would change the learning "
                "rate); only a pace that would miss the budget re-times the rest of the decay")
        return changed

    def state(self, clock: float) -> dict:
        """What a checkpoint keeps: {"budget": seconds spent, plans, the decay's anchor}, and
        whether the total is final (`planned`)."""
        if self.planner is None:
            return {"planned": True}
        return {"planned": False, "budget": {
            "spent_seconds": self.planner.spent_before + clock, "plans": self.plans,
            "anchor": self.schedule.anchor}}

    def spent(self, clock: float) -> float | None:
        """The budget's seconds over every process of the run, where it ran with one from its
        start; None otherwise."""
        if self.cfg.max_minutes is None or not (self.planner or "spent_seconds" in self.saved):
            return None
        return clock + (self.planner.spent_before if self.planner else self.saved["spent_seconds"])

    def _plan_total(self, step: int, clock: float, final_steps: float) -> bool:
        """Plan (first) or revise the run's total from the measured pace, rank 0's measurement
        on every rank; a change is logged (metrics.jsonl: `planned_steps`,
        `previous_planned_steps`, `seconds_per_step`, `tokens_per_second`, `retimed`) and printed.
        Returns whether the total changed."""
        from accelerate.utils import broadcast

        planner, schedule, first = self.planner, self.schedule, self.plans == 0
        measured = torch.tensor([planner.plan(step, clock, final_steps),
                                 planner.seconds_per_step()],
                                dtype=torch.float64, device=self.accelerator.device)
        measured = broadcast(measured, from_process=0).tolist()
        wanted, per_step, rate = int(measured[0]), measured[1], planner.tokens_per_second()
        total = revised_total(schedule, step, wanted, first, per_step, planner.budget_seconds)
        if total is None:
            return False
        previous = schedule.total
        retimed = not schedule.revisable(step) or total < schedule.earliest_total(step)
        schedule.revise(step, total)
        row = {"step": step, "seconds_per_step": per_step, "tokens_per_second": rate,
               "planned_steps": total}
        pace = f"{per_step:.2f} s/step ({rate or 0:,.0f} padded tokens/s over the last " \
               f"{len(planner.window)} steps)"
        budget = f"train.max_minutes={self.cfg.max_minutes:g}"
        if first:
            self.accelerator.print(f"{budget}: {pace} measured here, so {total} steps in all "
                                   f"(train.max_steps={self.cfg.max_steps})")
            if total <= self.cfg.warmup_steps:
                self.accelerator.print(
                    f"warning: {total} steps do not finish the {self.cfg.warmup_steps}-step "
                    "warmup; lower train.warmup_steps or raise train.max_minutes")
        else:
            row["previous_planned_steps"] = previous
            if retimed:
                row["retimed"] = True
            how = ", the rest of the decay re-timed" if retimed else ""
            self.accelerator.print(f"{budget}: at step {step}, {pace}: {previous} -> {total} "
                                   f"steps in all{how}")
        self.log.write(row)
        return True
