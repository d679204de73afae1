"""Each prompt turn runs every method once, starting one method later than the turn before, so
the first run on a new prompt (which meets its shapes first) is spread over the methods."""

from __future__ import annotations

from draftsmith.eval.evaluate import method_order

METHODS = ["plain", "prompt_lookup", "drafter@e3", "drafter_lookup@e3"]


def test_every_turn_runs_every_method_once():
    for turn in range(9):
        assert sorted(method_order(METHODS, turn)) == sorted(METHODS)


def test_each_method_runs_first_equally_often():
    firsts = [method_order(METHODS, turn)[0] for turn in range(2 * len(METHODS))]
    assert {m: firsts.count(m) for m in METHODS} == dict.fromkeys(METHODS, 2)
    assert method_order(METHODS, 0) == METHODS  # the first turn in the given order
