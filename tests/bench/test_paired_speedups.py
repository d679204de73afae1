"""Paired speedup comparisons in BENCHMARKS.md: each prompt's timings kept per method in the same
order, and the bootstrap interval of a difference between two methods' set-mean speedups."""

from __future__ import annotations

import pytest

from draftsmith.bench.report_findings import paired_differences
from draftsmith.bench.report_stats import paired_speedup_difference, per_prompt_timings
from tests.bench.bench_results import bench_of


def record(method, set_name, item, seconds, tokens=10, turn=0):
    return {"method": method, "set_name": set_name, "item_id": item, "turn": turn,
            "new_tokens": tokens, "total_seconds": seconds}


def test_per_prompt_timings_pair_the_prompts_every_method_decoded():
    records = [record("plain", "gsm8k", "2", 1.0), record("fast", "gsm8k", "2", 0.5),
               record("plain", "gsm8k", "1", 2.0), record("fast", "gsm8k", "1", 1.0),
               record("plain", "gsm8k", "3", 1.0)]  # "fast" never decoded prompt 3
    table = per_prompt_timings(records)
    assert table == {"gsm8k": {"prompts": [["1", 0], ["2", 0]],
                               "plain": [[10, 2.0], [10, 1.0]], "fast": [[10, 1.0], [10, 0.5]]}}


def test_a_difference_every_prompt_shows_has_a_tight_interval():
    # "fast" is 2x plain on every prompt of both sets, "same" 1x: the difference is 1.0x exactly
    records = [record(m, s, str(i), seconds * (0.5 if m == "fast" else 1.0))
               for s in ("gsm8k", "mt_bench") for i, seconds in enumerate((1.0, 2.0, 3.0))
               for m in ("plain", "fast", "same")]
    point, low, high = paired_speedup_difference(per_prompt_timings(records), "fast", "same")
    assert point == pytest.approx(1.0) and low == pytest.approx(1.0) and high == pytest.approx(1.0)


def test_a_difference_a_few_prompts_make_has_an_interval_through_zero():
    # "a" wins big on one prompt and loses a little on the others: the mean favours it, the
    # prompt sample cannot tell
    timings = {"plain": [1.0] * 6, "a": [0.25, 1.1, 1.1, 1.1, 1.1, 1.1], "b": [1.0] * 6}
    records = [record(m, "gsm8k", str(i), t) for m, ts in timings.items()
               for i, t in enumerate(ts)]
    point, low, high = paired_speedup_difference(per_prompt_timings(records), "a", "b")
    assert point > 0 and low < 0 < high
    assert paired_speedup_difference(per_prompt_timings(records), "a", "missing") is None


def test_the_report_names_each_compared_pair_with_its_interval():
    records = [record(m, "gsm8k", str(i), t) for i in range(4)
               for m, t in (("plain", 1.0), ("prompt_lookup", 0.8), ("drafter_dynamic@x", 0.7),
                            ("drafter_lookup@x", 0.5))]
    summary = {"all": {m: {} for m in ("plain", "prompt_lookup", "drafter_dynamic@x",
                                       "drafter_lookup@x")}}
    summary["gsm8k"] = {m: {"speedup": s} for m, s in (("plain", 1.0), ("prompt_lookup", 1.25),
                        ("drafter_dynamic@x", 1 / 0.7), ("drafter_lookup@x", 2.0))}
    bench = bench_of(config={"speedup_bar": 1.6, "eval": {"methods": {}}, "kinds": []},
                     eval={"0": {"summary": summary, "per_prompt": per_prompt_timings(records)}})
    lines = paired_differences(bench)
    assert lines[0].startswith("Speedup differences on the same 4 prompts")
    assert any("minus" in line and "+0.75x (95% interval +0.75 to +0.75x" in line
               for line in lines)  # the hybrid: 2.0x against prompt lookup's 1.25x
    assert len([line for line in lines if line.startswith("- ")]) == 2
