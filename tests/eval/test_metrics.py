"""Metric arithmetic on hand-made records."""

import math

import pytest

from draftsmith.eval.metrics import RunRecord, acceptance_by_depth, summarize, summarize_all
from draftsmith.eval.report import identical_lines


def test_acceptance_by_depth_is_conditional_on_reaching_the_depth():
    # four steps with depth-3 chains accepting 0, 1, 3, 2 drafts
    rates = acceptance_by_depth([0, 1, 3, 2], [3, 3, 3, 3])
    assert rates == [3 / 4, 2 / 3, 1 / 2]


def test_summary_tau_latency_and_split():
    # the prefill chose the first of 7 tokens, three steps the other 6
    record = RunRecord("x", "s", "1", 0, new_tokens=7, total_seconds=1.0, prefill_seconds=0.1,
                       draft_seconds=0.2, verify_seconds=0.6, accepted_per_step=[2, 0, 1],
                       depth_per_step=[2, 2, 2], tokens_per_step=[3, 1, 2],
                       step_seconds=[0.3, 0.3, 0.3])
    s = summarize([record])
    assert s["tau"] == 2.0 and s["tokens_per_second"] == 7.0
    assert s["time_split"]["bookkeeping"] == pytest.approx(0.1)
    # per-token latencies of the steps' tokens: 0.1 x3, 0.3 x1, 0.15 x2 -> median 0.125 s
    assert s["latency_ms_p50"] == pytest.approx(125.0)
    assert s["ttft_ms_p50"] == pytest.approx(100.0)  # the prefill's


def test_speedup_is_relative_to_the_baseline_in_the_same_set():
    records = [RunRecord("plain", "a", "1", 0, 10, 2.0), RunRecord("fast", "a", "1", 0, 10, 1.0),
               RunRecord("plain", "b", "1", 0, 10, 1.0), RunRecord("fast", "b", "1", 0, 10, 1.0)]
    table = summarize_all(records)
    assert table["a"]["fast"]["speedup"] == 2.0 and table["b"]["fast"]["speedup"] == 1.0
    assert table["all"]["fast"]["speedup"] == pytest.approx(1.5)
    assert table["all"]["plain"]["tau"] is None and not math.isnan(table["all"]["plain"]["seconds"])


def test_identical_footer_explains_a_bf16_difference_and_names_the_check():
    same = {"drafter": (4, 4), "prompt_lookup": (4, 4)}
    parted = {"drafter": (1, 4), "prompt_lookup": (4, 4)}
    assert identical_lines(same, "bfloat16") == [
        "identical to plain greedy output: drafter 100%, prompt_lookup 100%"]
    assert len(identical_lines(parted, "float32")) == 1  # float32: the gate's business, no excuse
    head, note = identical_lines(parted, "bfloat16")
    assert head == "identical to plain greedy output: drafter 25%, prompt_lookup 100%"
    assert "in bfloat16" in note and "without a bug" in note and "--check-lossless" in note
