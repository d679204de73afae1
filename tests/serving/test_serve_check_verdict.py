"""The serve-check's verdict in words: a low engine acceptance is blamed on the export only when
draftsmith's own loop, on the same prompts, accepted clearly more."""

from __future__ import annotations

from draftsmith.serving.serve_check import ServeCheckSettings, failures


def summary(engine_rate: float, loop_rate: float | None) -> dict:
    result = {"identical": [30, 30], "records": [],
              "engine_stats": {"acceptance": engine_rate, "accepted_tokens": 112,
                               "draft_tokens": 4999}}
    if loop_rate is not None:
        result["draftsmith"] = {"acceptance": loop_rate}
    return result


def test_a_weak_drafter_that_the_loop_agrees_with_is_named_as_such():
    (problem,) = failures(summary(0.022, 0.019), ServeCheckSettings())
    assert "accepted 112 of 4999 draft tokens (2.2% < --min-acceptance 5%)" in problem
    assert "own loop accepted 1.9% on the same prompts: the export and the engine agree" in problem


def test_an_engine_far_below_the_loop_or_without_one_blames_the_export():
    for loop in (0.30, None, 0.0):
        (problem,) = failures(summary(0.022, loop), ServeCheckSettings())
        assert "the export and the engine disagree. Usual causes: aux layer ids" in problem, loop
    assert failures(summary(0.30, 0.31), ServeCheckSettings()) == []
