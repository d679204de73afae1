"""A benchmark config with a wrong-typed or out-of-range eval setting is refused when it is read,
not hours later when its evaluation starts after data and training (issue #18)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import assert_refused, run_cli

RECIPE = Path(__file__).resolve().parents[2] / "recipes/smollm2-135m/eagle1.yaml"


def write_config(tmp_path: Path, eval_overrides: dict, **top) -> Path:
    data = tmp_path / "data.yaml"
    data.write_text("data: {source: sharegpt}\n")
    bench = {"target": "smollm2-135m-instruct", "data": str(data), "out_dir": str(tmp_path / "run"),
             "kinds": {"eagle1": {"recipe": str(RECIPE)}},
             "eval": {"bench": ["gsm8k"], "methods": {"drafter_dynamic@eagle1": "EAGLE-2"},
                      **eval_overrides}, **top}
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(bench, sort_keys=False))
    return path


@pytest.mark.parametrize(("eval_overrides", "top", "phrases"), [
    ({"limit": 0}, {}, ["eval.limit = 0: must be an integer >= 1"]),
    ({"num_draft_tokens": "many"}, {}, ["eval.num_draft_tokens = 'many': must be an integer"]),
    ({"temperatures": ["hot"]}, {}, ["eval.temperatures = ['hot']", "numbers >= 0"]),
    ({"tree": {"topk": 0, "depth": 4, "total_tokens": 8}}, {},
     ["eval.tree = ", "topk, depth and total_tokens, each an integer >= 1"]),
    ({"bench": ["mmlu"]}, {}, ["eval.bench = ['mmlu']", "mt_bench, humaneval, gsm8k"]),
    ({"methods": {"eagle": "EAGLE"}}, {}, ["eval.methods: unknown method 'eagle'", "choose from"]),
    ({"methods": {"draft_model": "draft"}}, {}, ["needs a classic draft model: set eval.draft_model"]),
    ({}, {"dtype": "fp8"}, ["dtype = 'fp8': choose one of: auto, float32"]),
    ({}, {"budget_minutes": "long"}, ["budget_minutes = 'long': must be a number"]),
])
def test_bad_bench_values_are_refused_before_any_stage(tmp_path, eval_overrides, top, phrases):
    path = write_config(tmp_path, eval_overrides, **top)
    report = tmp_path / "BENCHMARKS.md"
    result = run_cli(["bench", "--config", str(path), "--report", str(report)])
    assert_refused(result, *phrases)
    assert not (tmp_path / "run").exists() and not report.exists()


def test_the_same_config_with_good_values_is_accepted(tmp_path):
    from draftsmith.bench.config import load_bench_config

    config = load_bench_config(write_config(tmp_path, {"limit": 1, "temperatures": [0, 1.0]}))
    assert config.eval.limit == 1 and config.eval.temperatures == [0, 1.0]
