"""The wall-clock planner's arithmetic: the pace it measures, the total it plans, and the
schedule's rules for a revised total (moved freely, then fixed, then re-timed only to hold the
budget), with hand-computed values."""

from __future__ import annotations

import pytest

from draftsmith.train.budget import (
    BudgetPlanner,
    StepSchedule,
    revised_total,
)


def planner_after(steps, budget=60.0, max_steps=1000, spent_before=0.0):
    """A planner fed (seconds, padded tokens, after_pause) per step, the clock summed."""
    planner, clock = BudgetPlanner(budget, max_steps, spent_before), 0.0
    for seconds, tokens, pause in steps:
        clock += seconds
        planner.record(clock, tokens, pause)
    return planner, clock


def test_the_pace_is_recent_padded_tokens_per_second_a_stall_left_out():
    # step 1 (setup included) is not a pace; then 100 tokens in 0.5 s, one 5 s stall among 16
    steps = [(3.0, 100, False)] + [(0.5, 100, False)] * 15 + [(5.0, 100, False)]
    planner, _ = planner_after(steps)
    assert planner.ready() and len(planner.window) == 16
    assert planner.tokens_per_second() == pytest.approx(200.0)  # the stall and one step trimmed
    assert planner.seconds_per_step() == pytest.approx(0.5)
    # a lasting slowdown (4 s per 100 tokens) moves the pace within the window
    planner, _ = planner_after(steps[:-1] + [(4.0, 100, False)] * 8)
    assert planner.seconds_per_step() == pytest.approx((6 * 0.5 + 6 * 4.0) / 12)


def test_a_long_run_measures_its_pace_over_its_last_minutes():
    """A long budget's pace spans its last 2%: a burst of other work on the machine (23 slow
    steps) among 261 is trimmed away, where 16 steps would have been all burst."""
    budget = 400 * 60.0  # 2% = 480 s
    steps = [(3.0, 100, False)] + [(1.5, 100, False)] * 400 + [(3.9, 100, False)] * 23
    planner, _ = planner_after(steps, budget=budget, max_steps=100_000)
    assert planner.window_seconds - planner.window[0][1] < 480 <= planner.window_seconds
    assert len(planner.window) == 261 + 23  # 89.7 s of burst and 261 x 1.5 s: 481.2 s
    assert planner.seconds_per_step() == pytest.approx(1.5)
    short, _ = planner_after(steps, budget=60.0, max_steps=100_000)  # 2% = 1.2 s: 16 steps
    assert len(short.window) == 16 and short.seconds_per_step() > 3.5
    many, _ = planner_after([(0.01, 100, False)] * 3000, budget=budget, max_steps=100_000)
    assert len(many.window) == 1024  # the window's ceiling


def test_a_step_costs_the_mean_load_at_the_recent_pace_plus_pauses():
    # batches grow from 100 to 300 padded tokens at 200 tokens/s: the long-run load is their mean
    steps = [(1.0, 100, False)] + [(0.5, 100, False)] * 3 + [(1.5, 300, False)] * 4
    planner, _ = planner_after(steps)
    assert planner.tokens_per_second() == pytest.approx(200.0)
    assert planner.seconds_per_step() == pytest.approx(200 / 200)  # mean of 4x100 and 4x300
    # a checkpoint before a step: 2 s beyond its 0.5 s are pause time, spread over the steps
    planner, _ = planner_after([*steps[:4], (2.5, 100, True)])
    assert len(planner.window) == 3 and planner.pause_seconds == pytest.approx(2.0)
    assert planner.seconds_per_step() == pytest.approx(0.5 + 2.0 / 5)


def test_steps_that_all_follow_a_pause_still_give_a_pace():
    # a checkpoint after every step (save_every 1): with no pace yet the pause is the step's cost,
    # so the planner is ready after as many steps as without pauses (it once never planned)
    planner, _ = planner_after([(1.0, 100, True)] + [(0.8, 100, True)] * 3)
    assert planner.ready() and planner.seconds_per_step() == pytest.approx(0.8)
    planner.record(10.0, 100, True)  # with a pace, a paused step's excess is pause time again
    assert len(planner.window) == 3 and planner.pause_seconds == pytest.approx((10.0 - 3.4) - 0.8)


def test_a_stall_among_the_first_steps_is_not_the_pace():
    # a resumed run re-plans from its first three measured steps: one stall is left out
    steps = [(30.0, 100, False)] + [(0.5, 100, False)] * 2 + [(9.0, 100, False)]
    resumed, _ = planner_after(steps, spent_before=600.0)
    assert resumed.ready() and resumed.tokens_per_second() == pytest.approx(200.0)
    fresh, _ = planner_after(steps)  # a new run's first plan, the same way
    assert fresh.ready() and fresh.tokens_per_second() == pytest.approx(200.0)
    assert fresh.plan(4, 40.0, final_steps=0) == 4 + 40  # (60 s - 40 s) / 0.5 s


def test_the_plan_fits_the_budget_left_after_the_final_evaluation():
    steps = [(1.0, 100, False)] + [(0.5, 100, False)] * 3  # 2.5 s on the clock, 0.5 s a step
    planner, clock = planner_after(steps, budget=20.0)
    # 20 s - 2.5 s - 2 final steps' 1 s = 16.5 s: 33 more steps
    assert planner.plan(4, clock, final_steps=2) == 4 + 33
    resumed, clock = planner_after(steps, budget=20.0, spent_before=10.0)  # a resumed run
    assert resumed.plan(4, clock, final_steps=2) == 4 + 13
    assert planner_after(steps, max_steps=20)[0].plan(4, clock, 2) == 20  # the ceiling
    assert planner_after(steps, budget=2.0)[0].plan(4, clock, 2) == 5  # over: one more step


def test_wsd_moves_its_stable_phase_until_the_decay_starts():
    wsd = StepSchedule(2, 100, "wsd", 0.2)  # decays over the last 20 steps, from step 80
    assert wsd.revisable(79) and not wsd.revisable(80)
    assert wsd.earliest_total(50) == 64  # 63 - round(12.6) = 50: no later than 50; 64 - 13 = 51
    wsd.revise(50, 70)  # shrink: the rate so far unchanged, the decay now from step 56
    assert [wsd(s) for s in (50, 55, 56, 63, 70)] == [1.0, 1.0, 1.0, 0.5, 0.0]
    assert wsd.anchor is None


def test_a_budget_that_ends_in_the_stable_phase_decays_from_there():
    wsd = StepSchedule(2, 100, "wsd", 0.2)
    wsd.revise(50, 54)  # a decay from step 80 cannot fit: from 1.0 at 50 to zero at 54
    assert wsd.anchor == (50, 0.0) and not wsd.revisable(51)
    assert [wsd(s) for s in (50, 52, 54)] == [1.0, 0.5, 0.0]


def test_past_the_fixed_point_a_revision_re_times_the_rest_of_the_decay():
    wsd = StepSchedule(0, 100, "wsd", 0.2)
    before = wsd(90)  # halfway down: 0.5
    wsd.revise(90, 95)  # the pace fell: the rest of the decay in 5 steps, not 10
    assert wsd.anchor == (90, 0.5) and not wsd.revisable(91)
    assert wsd(90) == before and [round(wsd(s), 3) for s in (91, 93, 95)] == [0.4, 0.2, 0.0]
    cosine = StepSchedule(0, 100, "cosine")
    assert cosine.revisable(49) and not cosine.revisable(50)  # COSINE_REVISABLE: half the run
    before = cosine(60)
    cosine.revise(60, 140)  # stretched: the rate goes on from where it is, to zero at 140
    assert cosine(60) == pytest.approx(before) and cosine(140) == pytest.approx(0.0)
    assert cosine(61) < before and cosine(100) > StepSchedule(0, 100, "cosine")(100)
    constant = StepSchedule(1, 10, "constant")
    constant.revise(9, 30)
    assert constant.revisable(29) and constant.anchor is None and constant(20) == 1.0


def test_linear_decays_evenly_from_the_peak_after_warmup_to_zero_at_the_end():
    linear = StepSchedule(4, 104, "linear")  # speculators' scheduler, its 4 warmup steps
    assert [linear(s) for s in (0, 3)] == [0.25, 1.0]
    assert [round(linear(s), 3) for s in (4, 29, 54, 79, 104)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert linear.progress(54) == pytest.approx(0.5)
    assert linear.revisable(51) and not linear.revisable(52)  # half the run, as cosine
    linear.revise(30, 204)  # while revisable the horizon moves: the rate at 54 rises
    assert linear.anchor is None and linear(54) == pytest.approx(0.75)
    linear.revise(154, 170)  # past half: the rest of the decay re-timed from 0.25 to zero
    assert linear.anchor == (154, 0.75) and linear(154) == pytest.approx(0.25)
    assert linear(162) == pytest.approx(0.125) and linear(170) == 0.0


def test_revisions_move_the_total_only_for_a_real_change():
    wsd = StepSchedule(0, 100, "wsd", 0.2)
    assert revised_total(wsd, 10, 90, first=True, seconds_per_step=1, budget_seconds=100) == 90
    assert revised_total(wsd, 10, 98, False, 1, 100) is None  # 2 steps: within 2%
    assert revised_total(wsd, 10, 97, False, 1, 100) == 97
    # the budget ends before a decay could start: cut to it (decay re-timed), not stretched
    assert revised_total(wsd, 60, 40, False, 1, 100) == 61
    short = StepSchedule(0, 78, "wsd", 0.2)  # decays from step 62; at step 60 it could from 76
    assert revised_total(short, 60, 75, False, 1, 100) is None  # 3 s early: within 5%, kept
    wsd.total = 70  # past its fixed point (decay from step 56): re-timed only past 5% of budget
    assert revised_total(wsd, 60, 74, False, 1, 100) is None  # would end 4 s late
    assert revised_total(wsd, 60, 76, False, 1, 100) == 76  # 6 s
    assert revised_total(wsd, 60, 40, False, 1, 100) == 61  # at least one more step
