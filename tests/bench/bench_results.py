"""BenchResults, EvalResults and TrainingRecords for the benchmark's tests: the parts a test
names, the rest as a run without them records it."""

from __future__ import annotations

from draftsmith.eval.results import BenchResults, EvalResults, TrainingRecord


def run_of(**parts) -> EvalResults:
    """An evaluation run: `parts` over an empty summary on a named machine."""
    return EvalResults(**{"config": {}, "summary": {"all": {}}, "hardware": "a CPU",
                          "date": "2026-12-06T05:00:00+00:00", "commit": "abc1234",
                          "torch": "2.9.0", **parts})


def record_of(**parts) -> TrainingRecord:
    """A drafter's training record: `parts` over a one-step run."""
    return TrainingRecord(**{"label": "a", "kind": "eagle3", "steps": 1, "seconds_per_step": 1.0,
                             "budget_minutes": 1.0, "train_minutes": 1.0, "batch_size": 1,
                             "features": "online", "held_out": {}, "recipe": "gone.yaml",
                             **parts})


def bench_of(**parts) -> BenchResults:
    """A benchmark's results: `parts`, its `eval` and `passes` runs given as `run_of` parts and
    its `training` records as `record_of` parts."""
    for key in ("eval", "passes"):
        parts[key] = {name: run_of(**run) for name, run in parts.get(key, {}).items()}
    parts["training"] = {label: record_of(label=label, **record)
                         for label, record in parts.get("training", {}).items()}
    return BenchResults(**{"config": {}, **parts})
