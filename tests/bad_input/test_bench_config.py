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
     ["eval.tree_topk = 0", "must be an integer >= 1"]),
    ({"tree": {"topk": 3}}, {}, ["eval.tree = ", "topk, depth and total_tokens, each an integer"]),
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


PASS_EXAMPLE = "map a pass name to {methods: [...], batch_sizes: [1, 2, 4, 8]}"


@pytest.mark.parametrize(("spec", "top", "phrases"), [
    ({"methods": ["prompt_lookup"], "target_quant": ["int4"]}, {},
     ["eval.passes.p.target_quant = ['int4']: 'int4' is not a quantization scheme",
      "choose from: none, int8, int8wo", PASS_EXAMPLE]),
    ({"methods": ["prompt_lookup"], "target_quant": "int8"}, {},
     ["eval.passes.p.target_quant = 'int8': list one or more of: none, int8, int8wo"]),
    ({"methods": ["prompt_lookup"], "batch_sizes": [0]}, {},
     ["eval.passes.p.batch_sizes = [0]: 0 is not a batch size", "integers >= 1"]),
    ({"methods": ["prompt_lookup"], "batch_sizes": [1, "two"]}, {},
     ["eval.passes.p.batch_sizes = [1, 'two']: 'two' is not a batch size"]),
    ({"methods": ["prompt_lookup"], "batch_size": [1, 2]}, {},
     ["unknown key(s) eval.passes.p.batch_size", "valid keys of a pass: methods, batch_sizes"]),
    ({"batch_sizes": [1, 2]}, {}, ["eval.passes.p.methods = None: list one or more eval methods"]),
    ({"methods": ["prompt_lookup"], "limit": 0}, {}, ["eval.passes.p.limit = 0: must be an integer"]),
    ({"methods": ["prompt_lookup"], "bench": ["long"]}, {},
     ["eval.passes.p.bench = ['long']: list one or more prompt sets of: mt_bench, humaneval, "
      "gsm8k, sharegpt_long"]),
    ({"methods": ["prompt_lookup"], "target_quant": ["none", "int8"]}, {"dtype": "bfloat16"},
     ["eval.passes.p has target_quant int8", "dtype = 'bfloat16'", "dtype: auto or float32"]),
    ({"methods": ["prompt_lookup"], "check_lossless": True}, {"dtype": "float16"},
     ["eval.passes.p has check_lossless: true", "dtype = 'float16'"]),
])
def test_every_pass_value_is_checked_when_the_config_is_read(tmp_path, spec, top, phrases):
    path = write_config(tmp_path, {"passes": {"p": spec}}, **top)
    report = tmp_path / "BENCHMARKS.md"
    result = run_cli(["bench", "--config", str(path), "--report", str(report)])
    assert_refused(result, *phrases)
    assert not (tmp_path / "run").exists() and not report.exists()


def test_good_passes_are_accepted(tmp_path):
    from draftsmith.bench.config import load_bench_config

    passes = {"batch": {"methods": ["prompt_lookup"], "batch_sizes": [1, 2, 4]},
              "quant": {"methods": ["prompt_lookup"], "target_quant": ["none", "int8", "int8wo"]}}
    config = load_bench_config(write_config(tmp_path, {"passes": passes}))
    assert config.eval.passes == passes


@pytest.mark.parametrize("kind", ["missing", "no vllm"])
def test_an_engine_python_without_the_engine_is_refused_when_read(tmp_path, monkeypatch, kind):
    python = tmp_path / "python"
    if kind == "no vllm":
        python.write_text("#!/bin/sh\nexit 1\n")
        python.chmod(0o755)
    monkeypatch.setenv("DRAFTSMITH_VLLM_PYTHON", str(python))
    eagle3 = RECIPE.with_name("eagle3.yaml")
    path = write_config(tmp_path, {"methods": {"drafter_dynamic@eagle3": "EAGLE-3"}},
                        kinds={"eagle3": {"recipe": str(eagle3)}},
                        engine={"drafter": "eagle3", "engines": ["llama.cpp", "vllm"]})
    result = run_cli(["bench", "--config", str(path)])
    problem = "does not exist" if kind == "missing" else "has no `vllm` module"
    assert_refused(result, f"$DRAFTSMITH_VLLM_PYTHON={python} {problem}")
    assert not (tmp_path / "run").exists()


def test_eval_prompts_that_cannot_fit_are_refused_before_the_data_stage(tmp_path, tiny_folder):
    from draftsmith.eval.prompts.sets import SOURCES
    from draftsmith.target.offline_models import cache_dir

    source = SOURCES["gsm8k"]
    if not (cache_dir() / "data" / source.package / source.relative_path).is_file():
        pytest.skip("the gsm8k prompt set is not installed (`draftsmith eval --bench gsm8k` does)")
    path = write_config(tmp_path, {"max_new_tokens": 600, "limit": 1}, target=str(tiny_folder))
    result = run_cli(["bench", "--config", str(path), "--report", str(tmp_path / "B.md")])
    assert_refused(result, "longer than the target's context of 512 tokens",
                   "eval.max_new_tokens 600 per turn", "1 of 1 prompts of gsm8k")
    assert not (tmp_path / "run").exists(), "refused before the data stage wrote anything"


def test_a_target_folder_never_receives_the_benchmark_s_results(tmp_path, monkeypatch):
    """A bench whose target is an absolute local folder wrote its results into the model folder
    and deleted a file there (`Path("benchmarks") / target` is the target itself): results go
    under benchmarks/ in a folder named after the target, and the model folder is untouched."""
    import json

    from draftsmith.bench.report import bench_name, write_benchmarks

    root = Path(__file__).resolve().parents[2]
    model = tmp_path / "models" / "my-llama"
    model.mkdir(parents=True)
    (model / "eval_t0.json").write_text("{}")  # a file of the user's, named like a result
    bench = json.loads((root / "benchmarks/qwen2.5-coder-1.5b-instruct/bench.json").read_text())
    bench["config"] = {**bench["config"], "target": str(model), "name": None}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    write_benchmarks([(bench, run_dir)], work / "BENCHMARKS.md", work / "none.json", [])
    assert sorted(p.name for p in model.iterdir()) == ["eval_t0.json"]
    folder = work / "benchmarks" / bench_name(bench["config"])
    assert folder.parent == work / "benchmarks" and (folder / "bench.json").is_file()
    assert bench_name({"target": "/models/llama-8b"}) == "models--llama-8b"
    assert bench_name({"target": "Qwen/Qwen3-8B"}) == "Qwen--Qwen3-8B"
    assert bench_name({"target": "../../etc"}) == "etc"


@pytest.mark.parametrize("name", ["../elsewhere", "/abs/folder", "a/b", ".hidden"])
def test_a_bench_name_must_be_one_plain_folder_name(tmp_path, name):
    path = write_config(tmp_path, {}, name=name)
    assert_refused(run_cli(["bench", "--config", str(path), "--stages", "none"]),
                   f"name = {name!r} must be one plain file name")
