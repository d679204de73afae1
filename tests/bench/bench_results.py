"""BenchResults and EvalResults for the report's tests: the parts a test names, the rest as a
run without them records it."""

from __future__ import annotations

from draftsmith.eval.results import BenchResults, EvalResults


def run_of(**parts) -> EvalResults:
    """An evaluation run: `parts` over an empty summary on a named machine."""
    return EvalResults(**{"config": {}, "summary": {"all": {}}, "hardware": "a CPU",
                          "date": "2026-12-06T05:00:00+00:00", "commit": "abc1234",
                          "torch": "2.9.0", **parts})


def bench_of(**parts) -> BenchResults:
    """A benchmark's results: `parts`, its `eval` and `passes` runs given as `run_of` parts."""
    for key in ("eval", "passes"):
        parts[key] = {name: run_of(**run) for name, run in parts.get(key, {}).items()}
    return BenchResults(**{"config": {}, "training": {}, **parts})
