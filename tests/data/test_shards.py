"""The shard bookkeeping regeneration and the hidden-state cache share: which shards are left,
and when a wall-clock budget closes a run (within half a shard of it, on either side)."""

from __future__ import annotations

import pytest

from draftsmith.data.shards import ShardReport, budget_has_room, next_shard_seconds


def manifest(*shards):
    """A manifest whose finished shards took these (seconds, tokens)."""
    return {"shards": [{"index": i, "seconds": s, "tokens": t} for i, (s, t) in enumerate(shards)]}


def test_the_next_shard_takes_what_the_latest_ones_took():
    assert next_shard_seconds(manifest(), 100, "tokens") is None
    # the latest four shards: (40 + 20 + 20 + 20) / 4 = 25 s, whatever their exact token counts
    done = manifest((40, 90), (40, 100), (20, 110), (20, 100), (20, 100))
    assert next_shard_seconds(done, 120, "tokens") == pytest.approx(25.0)
    # a smaller (last) shard proportionally less: 50 of the typical 102.5 tokens
    assert next_shard_seconds(done, 50, "tokens") == pytest.approx(25.0 * 50 / 102.5)


def test_no_shard_starts_that_would_end_more_than_half_of_itself_past_the_budget():
    done = manifest((30, 100), (30, 100), (30, 100))  # 90 s spent, 30 s a shard
    assert budget_has_room(done, None, 100, "tokens")
    assert budget_has_room(done, 105 / 60, 100, "tokens")  # ends at 120 s: 15 s past, half a shard
    assert not budget_has_room(done, 104 / 60, 100, "tokens")  # 16 s past: stop at 90 s
    assert budget_has_room(done, 104 / 60, 20, "tokens")  # a last shard of 6 s fits
    assert not budget_has_room(done, 90 / 60, 1, "tokens")  # the budget is spent
    assert budget_has_room(manifest(), 0.01, 100, "tokens")  # the first shard always starts


def test_the_report_skips_finished_shards_and_stops_for_the_budget():
    done = {"shards": [{"index": 1, "seconds": 30, "count": 2}]}
    report = ShardReport.start("out", done, 4)
    assert report.shards_skipped == 1 and not report.complete
    written = []
    for index in report.pending(done, [2, 2, 2, 2], "count", max_minutes=1.0,
                                stop_after_shards=None):
        written.append(index)
        done["shards"].append({"index": index, "seconds": 30, "count": 2})
        report.wrote(30, tokens=10)
    # 30 s spent before: shard 0 ends at 60 s, shard 2 would end at 90 s (30 past the 60 s budget)
    assert written == [0] and report.budget_reached and report.complete
    assert report.tokens_per_second == pytest.approx(10 / 30)
    again = ShardReport.start("out", done, 4)
    left = []
    for index in again.pending(done, [2, 2, 2, 2], "count", None, stop_after_shards=1):
        left.append(index)
        again.wrote(30, tokens=10)
    assert left == [2] and again.shards_skipped == 2 and not again.complete


def test_budget_line_says_time_spent_against_the_budget():
    from draftsmith.data.shards import budget_line, shard_seconds

    assert budget_line("data.cache.max_minutes", 178.0, 3) == \
        "data.cache.max_minutes=3: 2:58 spent (-1% of the budget)"
    assert budget_line("train.max_minutes", 400.0, 6).endswith("6:40 spent (+11% of the budget)")
    assert shard_seconds({"shards": [{"seconds": 1.5}, {"seconds": 2.0}]}) == 3.5
