"""`draftsmith bench` end to end on the real SmolLM2 with a tiny budget (shared data -> calibrated
training in its own process -> one evaluation with several named drafters -> BENCHMARKS.md and
plots), plus the config checks and the report's arithmetic."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from draftsmith.bench.config import load_bench_config
from draftsmith.bench.report_stats import set_mean
from draftsmith.bench.run import _metrics, kind_recipe
from draftsmith.bench.train_pace import seconds_per_step, tokens_per_second
from draftsmith.cli import main
from draftsmith.errors import DraftsmithError
from draftsmith.train.recipe import build_recipe
from tests.bench.bench_results import bench_of, record_of
from tests.helpers.state import require_offline_model

ROOT = Path(__file__).resolve().parents[2]
NAME = "smollm2-135m-instruct"


def write_configs(tmp_path: Path, **bench_overrides) -> Path:
    conversations = tmp_path / "convs.jsonl"
    conversations.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"Name {n} colours, briefly."},
        {"role": "assistant", "content": f"Here are {n} colours: red, green and blue."}]}) + "\n"
        for n in range(2, 9)))
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({
        "target": {"name": NAME, "dtype": "float32"},  # bf16 crawls without native bf16
        "data": {"source": str(conversations), "max_length": 64, "out_dir": "ignored",
                 "regenerate": None, "cache": {"kinds": ["eagle1"]}}}))
    bench = {
        "target": NAME, "data": str(data), "out_dir": str(tmp_path / "run"),
        "budget_minutes": 0.001, "calibration_steps": 3,
        "train": {"features": "offline", "batch_size": 2, "max_length": 64, "eval_fraction": 0.2},
        "kinds": {"eagle1": {"recipe": str(ROOT / "recipes/smollm2-135m/eagle1.yaml")}},
        "eval": {"bench": ["gsm8k"], "limit": 1, "max_new_tokens": 8, "temperatures": [0.0],
                 "tree": {"topk": 2, "depth": 2, "total_tokens": 3},
                 "methods": {"prompt_lookup": "prompt lookup",
                             "drafter_static@eagle1": "EAGLE-1",
                             "drafter_dynamic@eagle1": "EAGLE-2"},
                 "passes": {"lossless": {"methods": ["prompt_lookup", "drafter_dynamic@eagle1"],
                                         "check_lossless": True, "max_new_tokens": 6}}},
        "bars": {"drafter_dynamic@eagle1": 2.6}, "speedup_bar": 1.6,
        "expected_order": ["drafter_dynamic@eagle1", "drafter_static@eagle1"], **bench_overrides}
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(bench, sort_keys=False))
    return path


@pytest.mark.slow
def test_bench_end_to_end_writes_benchmarks_md(tmp_path, monkeypatch, capsys):
    require_offline_model(NAME)
    config = write_configs(tmp_path)
    monkeypatch.chdir(tmp_path)  # BENCHMARKS.md and benchmarks/ land in the working directory
    assert main(["bench", "--config", str(config)]) == 0
    run = tmp_path / "run"
    budget = json.loads((run / "train/eagle1/budget.json").read_text())
    assert budget["features"] == "offline" and budget["calibrated_seconds_per_step"] > 0
    assert (run / "train/eagle1/drafter/model.safetensors").is_file()
    meta = json.loads((run / "train/eagle1/drafter/draftsmith_drafter.json").read_text())
    assert meta["train_seconds"] > 0 and budget["train_minutes"] == meta["train_seconds"] / 60
    recipe = yaml.safe_load((run / "recipes/eagle1.yaml").read_text())
    assert recipe["data"]["out_dir"] == str(run / "data")
    # the run's own planner sizes it within the budget (the calibration's 3 steps only bound it)
    assert recipe["train"]["max_minutes"] == 0.001 and recipe["train"]["max_steps"] == 12
    trained = [json.loads(line) for line in (run / "train/eagle1/metrics.jsonl").open()]
    planned = [row["planned_steps"] for row in trained if "planned_steps" in row]
    assert planned and budget["steps"] == planned[-1] < 12
    payload = json.loads((run / "eval_t0/eval.json").read_text())
    rows = payload["summary"]["all"]
    assert list(rows) == ["plain", "prompt_lookup", "drafter_static@eagle1",
                          "drafter_dynamic@eagle1"]
    md = (tmp_path / "BENCHMARKS.md").read_text()
    assert "| EAGLE-2 |" in md and "| EAGLE-2 tau | >= 2.6 |" in md
    assert "missed" in md and "misses 2.6 by" in md
    assert "### Training: 0.001 wall-clock minutes per drafter" in md
    assert "Steps = what each run's own planner (`train.max_minutes`) fitted" in md
    assert "Speedup differences on the same 1 prompts" in md  # the best drafter vs prompt lookup
    assert "Literature order: EAGLE-2 > EAGLE-1. Measured:" in md
    assert "### Lossless gate (`lossless` run, greedy, float32): 1 prompt(s) per set of gsm8k" in md
    assert "2 methods reproduced plain greedy decoding token for token in float32." in md
    gate = json.loads((run / "eval_lossless/eval.json").read_text())
    assert gate["config"]["max_new_tokens"] == 6 and gate["config"]["dtype"] == "float32"
    for name in ("speedup", "acceptance", "training"):
        assert (tmp_path / "benchmarks" / NAME / f"{name}.png").stat().st_size > 0
    assert (tmp_path / "benchmarks" / NAME / "eval_t0.json").is_file()
    assert (tmp_path / "benchmarks" / NAME / "eval_lossless.json").is_file()  # each pass's raw run

    # a second run resumes: nothing is trained or evaluated again
    before = (run / "eval_t0/eval.json").stat().st_mtime_ns
    assert main(["bench", "--config", str(config)]) == 0
    assert (run / "eval_t0/eval.json").stat().st_mtime_ns == before
    assert json.loads((run / "train/eagle1/attempts.json").read_text()).__len__() == 1

    # an earlier machine's verify-cost curve (benchmarks/machine-*/) closes the report
    earlier = tmp_path / "benchmarks" / "machine-earlier"
    earlier.mkdir()
    (earlier / "verify_cost.json").write_bytes(
        (ROOT / "benchmarks/machine-amd-epyc-avx2/verify_cost.json").read_bytes())
    assert main(["bench", "--config", str(config), "--stages", "none"]) == 0
    md = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Verify cost on another machine: AMD EPYC (avx2, fma; no native bf16)" in md
    assert "| EAGLE-2 |" in md  # the report-only run still has every table


def test_a_stopped_training_s_minutes_are_counted(tmp_path, monkeypatch):
    """A training process stopped (a signal, a crash) spent its minutes too: the next attempt's
    record adds them (a drafter without its own budget clock reports the attempts' sum)."""
    from draftsmith.bench import run as bench_run

    def stopped(*args):
        time.sleep(0.05)
        raise DraftsmithError("training was stopped by SIGTERM and saved a checkpoint")

    monkeypatch.setattr(bench_run, "run_training_process", stopped)
    config = load_bench_config(write_configs(tmp_path))
    with pytest.raises(DraftsmithError, match="stopped by SIGTERM"):
        bench_run._train_and_record(config, config.kind("eagle1"), {}, 1.0, 1.0, print)
    attempts = json.loads((tmp_path / "run/train/eagle1/attempts.json").read_text())
    assert len(attempts) == 1 and attempts[0] >= 0.05


@pytest.mark.parametrize(("overrides", "message"), [
    ({"kinds": {"eagle1": {"recipe": "no/such.yaml"}}}, "no/such.yaml, which does not exist"),
    ({"budget_minutes": 0}, "budget_minutes must be > 0"),
    ({"colour": 1}, "unknown key"),
    ({"relative_bars": [{"method": "drafter_dynamic@eagle1", "metric": "tau",
                         "than": "prompt_lookup"}]}, "metric must be one of speedup, draft_share"),
    ({"relative_bars": [{"method": "drafter@mtp", "metric": "speedup",
                         "than": "prompt_lookup"}]}, "method 'drafter@mtp' is not one of the eval"),
    ({"relative_bars": [{"method": "prompt_lookup", "metric": "speedup", "than": "prompt_lookup",
                         "factor": 0}]}, "factor must be a number > 0"),
    ({"relative_bars": {"method": "prompt_lookup"}}, "must be a list; e.g. relative_bars"),
])
def test_bad_bench_configs_are_clear_errors(tmp_path, overrides, message):
    with pytest.raises(DraftsmithError, match=message):
        load_bench_config(write_configs(tmp_path, **overrides))


def test_an_eval_method_must_name_a_trained_drafter(tmp_path):
    path = write_configs(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["eval"]["methods"]["drafter@mtp"] = "MTP"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(DraftsmithError, match="names no drafter in `kinds`"):
        load_bench_config(path)


def test_bench_rejects_unknown_stages(tmp_path, capsys):
    assert main(["bench", "--config", str(write_configs(tmp_path)), "--stages", "tran"]) == 2
    assert "unknown stage(s) ['tran']" in capsys.readouterr().err


def test_report_means_weight_each_prompt_set_equally():
    summary = {"a": {"m": {"tau": 1.0}}, "b": {"m": {"tau": 3.0}}, "all": {"m": {"tau": 9.9}}}
    assert set_mean(summary, "m", "tau") == 2.0
    rows = [{"step": s, "loss": 1.0, "seconds": t} for s, t in ((1, 5.0), (2, 6.0), (4, 8.0))]
    assert seconds_per_step(rows) == 1.0
    assert tokens_per_second(rows) is None  # a run logged before steps recorded their tokens
    rows = [{**r, "tokens": 100 * r["step"]} for r in rows] + [{"step": 4, "eval/acc_0": 0.5}]
    assert tokens_per_second(rows) == (200 + 400) / 3.0
    # scaled to the data's mean step: the time from step 2's end to step 4's covers steps 3 and 4,
    # which held 200 and 400 tokens, a mean of 300, against 600 in an average step of the data:
    # twice the time
    rows = [{"step": s, "loss": 1.0, "seconds": 4.0 + s, "tokens": t}
            for s, t in ((1, 100), (2, 100), (3, 200), (4, 400))]
    assert seconds_per_step(rows) == 1.0
    assert seconds_per_step(rows, step_tokens=600.0) == pytest.approx(2.0)


def test_the_calibration_scales_to_the_data_s_mean_batch(tmp_path):
    """Row batches hold batch_size conversations of the data's mean length; token batches hold
    about batch_tokens padded tokens whatever the conversations, so a calibration is not scaled."""
    from draftsmith.bench.run import mean_step_tokens

    (tmp_path / "summary.json").write_text(json.dumps(
        {"rendering": {"rendered": 100, "tokens": 30_000}}))
    rows = {"batching": "rows", "batch_size": 2, "grad_accum": 2}
    assert mean_step_tokens(tmp_path, rows) == 1200.0
    assert mean_step_tokens(tmp_path / "none", rows) is None
    assert mean_step_tokens(tmp_path, {"batch_size": 4}) is None  # the default: tokens


@pytest.mark.parametrize("path", sorted((ROOT / "recipes/bench").glob("*.yaml")), ids=lambda p: p.name)
def test_bench_configs_parse_and_name_their_command(path):
    config = load_bench_config(path)
    for entry in config.kinds:
        build_recipe(kind_recipe(config, entry))
    first = path.read_text().splitlines()[0]
    assert first.startswith(f"# draftsmith bench --config {path.relative_to(ROOT)}")


def test_lossless_line_of_the_report():
    from draftsmith.bench.report_sections import lossless_line as _lossless_line

    assert _lossless_line(None) == [] and _lossless_line({"greedy": False}) == []
    ok = {"greedy": True, "dtype_exact": True, "checked": ["a", "b"], "failures": []}
    assert _lossless_line(ok) == ["Lossless check: 2 methods reproduced plain greedy decoding "
                                  "token for token in float32."]
    bad = {**ok, "failures": [{"method": "a", "set": "gsm8k", "item": "3", "index": 7}]}
    assert _lossless_line(bad) == ["Lossless check: a left plain decoding on gsm8k/3 at new token "
                                   "7 (float32: a bug)."]


@pytest.mark.parametrize(("engine", "message"), [
    ({"drafter": "eagle1"}, "is a eagle1 drafter; the engine check runs EAGLE-3"),
    ({"drafter": "eagle9"}, "engine.drafter 'eagle9' is not in `kinds`"),
    ({"drafter": "eagle1", "threads": 2}, "give `drafter`"),
    ({"drafter": "eagle3", "engines": ["sglang"]}, "engine.engines"),
    ([{"drafter": "eagle1", "outtypes": ["f16"]}], "is a eagle1 drafter"),
    ({"drafter": "eagle3", "outtypes": ["q4_0"]}, "engine.outtypes"),
    ({"drafter": "eagle3", "target_outtype": "q4_0"}, "engine.target_outtype = 'q4_0'"),
    ("eagle1", "give one check"),
])
def test_bad_engine_sections_are_clear_errors(tmp_path, engine, message):
    with pytest.raises(DraftsmithError, match=message):
        load_bench_config(write_configs(tmp_path, engine=engine))


def test_engine_section_puts_the_engine_next_to_the_loop():
    from draftsmith.bench.report_sections import engine_section

    check = {"engine": "llama.cpp", "version": "b1", "draft_max": 2, "spec_type": "draft-eagle3",
             "target_gguf": "/c/T.Q4_1.gguf", "prompts": 30, "prompt_sets": ["gsm8k"],
             "max_new_tokens": 96, "identical": [30, 30], "passed": True,
             "engine_stats": {"tau": 1.8, "acceptance": 0.4, "acceptance_per_position": [0.6, 0.2],
                              "tokens_per_second_spec": 150.0, "tokens_per_second_plain": 100.0,
                              "speedup": 1.5},
             "draftsmith": {"tau": 1.75, "acceptance": 0.38, "acceptance_per_position": [0.58, 0.19],
                            "tokens_per_second": 20.0, "same_answer_as_engine": [12, 30]}}
    vllm = {**check, "engine": "vLLM (CPU build)", "version": "0.32.0", "target_gguf": None,
            "speculative_config": {"method": "eagle3", "model": "/x", "num_speculative_tokens": 2},
            "dtype": "float32", "passed": False}
    types = {name: {**check["engine_stats"], "draft_gguf_bytes": size, "identical": [30, 30]}
             for name, size in (("f32", 79_200_000), ("q8_0", 22_400_000))}
    dflash = {**check, "kind": "dflash", "export_format": "dflash", "draft_max": 7,
              "draft_types": types}
    f32 = {**dflash, "target_outtype": "f32", "target_gguf": "/c/t-f32.gguf",
           "identical": [29, 30], "records": [{"identical": False, "tie_gap": 0.003}]}
    text = "\n".join(engine_section(bench_of(engines={"eagle3 in llama.cpp": check,
                                                      "eagle3 in vllm": vllm,
                                                      "dflash in llama.cpp": dflash,
                                                      "dflash8k in llama.cpp": f32})))
    assert "on the target's folder converted by the same converter to GGUF in f32 (the weights " \
           "the loop decodes)" in text
    assert ("identical to its plain decoding: 29/30 (1 part at near-ties: the target's float32 "
            "logit gap 0.003 <= 0.05)") in text
    assert "### In a serving engine: llama.cpp b1 (greedy, EAGLE-3 chain of 2)" in text
    assert "### In a serving engine: llama.cpp b1 (greedy, DFlash chain of 7)" in text
    assert "The trained DFlash drafter exported (`dflash`)" in text
    assert "| q8_0 | 22.4 MB | 1.80 | 40.0% | 150.0 | **1.50x** | 30/30 |" in text
    assert "accepted at draft position 2" in text and "20.0%" in text and "19.0%" in text
    assert "1.50x" in text and "identical to its plain decoding: 30/30" in text
    assert "equal to the engine's: 12/30" in text and "Check passed." in text
    assert "### In a serving engine: vLLM (CPU build) 0.32.0" in text
    assert '`--speculative-config {"method": "eagle3", "num_speculative_tokens": 2}`' in text
    assert "Check FAILED." in text
    assert engine_section(bench_of()) == []


def test_a_pass_without_a_quantized_copy_gets_no_quantized_section(tmp_path):
    from draftsmith.bench.report_sections import passes_section

    bench = bench_of(passes={"batch": {"target_variants": {"none": {}}}})
    assert passes_section(bench, tmp_path) == []


def test_a_lossless_pass_gets_its_gate_section(tmp_path):
    from draftsmith.bench.report_sections import passes_section

    check = {"greedy": True, "dtype_exact": True, "failures": [],
             "checked": ["prompt_lookup", "drafter_chain@eagle3"]}
    bench = bench_of(passes={"lossless": {"lossless_check": check,
                                          "config": {"limit": 3, "max_new_tokens": 32,
                                                     "check_lossless": True},
                                          "summary": {"mt_bench": {}, "gsm8k": {}, "all": {}}}})
    text = "\n".join(passes_section(bench, tmp_path))
    assert "### Lossless gate (`lossless` run, greedy, float32): 3 prompt(s) per set of " \
           "mt_bench, gsm8k (MT-bench: both turns), 32 new tokens per turn" in text
    assert "2 methods reproduced plain greedy decoding token for token in float32." in text
    bench.passes["lossless"].config["check_lossless"] = False  # no gate asked: no section
    assert passes_section(bench, tmp_path) == []


def test_a_titled_pass_gets_its_own_method_table(tmp_path):
    from draftsmith.bench.report import titled_passes

    row = {"tau": 1.5, "tokens_per_second": 20.0, "speedup": 1.25, "runs": 10,
           "acceptance_by_depth": [0.5, 0.3], "time_split": {"draft": 0.1, "verify": 0.9}}
    plain = {"tau": 1.0, "tokens_per_second": 16.0, "speedup": 1.0, "runs": 10,
             "acceptance_by_depth": [], "time_split": {"draft": 0.0, "verify": 1.0}}
    summary = {s: {"plain": plain, "drafter_chain@dflash8k": row} for s in ("mt_bench", "all")}
    bench = bench_of(config={"eval": {"methods": {}, "passes": {"v": {"title": "DFlash 8K"},
                                                               "batch": {}}}},
                     passes={"v": {"config": {"limit": 10, "max_new_tokens": 48},
                                   "summary": summary},
                             "batch": {"config": {}, "summary": summary}})
    text = "\n".join(titled_passes(bench))
    assert text.startswith("### DFlash 8K (`v` run, greedy, 10 prompt(s) per set, 48 new tokens")
    assert "| drafter_chain@dflash8k | 1.50 | 0.50 | 0.30 |" in text and "**1.25x**" in text
    assert "batch" not in text  # untitled passes keep their own sections
    bench.config["eval"]["passes"]["v"]["bench"] = ["sharegpt_long"]  # its own prompt sets
    assert "\n".join(titled_passes(bench)).startswith(
        "### DFlash 8K (`v` run, greedy, prompts: sharegpt_long, 10 prompt(s) per set")
    assert "Trees sized" not in text
    bench.passes["v"].tree_budgets = {"drafter_chain@dflash8k": {"depth": 2, "total_tokens": 5}}
    assert "Trees sized for this machine: drafter_chain@dflash8k: depth 2 x 5 tokens." in \
        "\n".join(titled_passes(bench))


def test_a_pass_method_without_a_name_borrows_its_kind_s_with_its_label(tmp_path):
    from draftsmith.bench.report import _own_data
    from draftsmith.bench.report_stats import method_names

    recipe = tmp_path / "dflash.yaml"
    recipe.write_text("drafter: {kind: dflash}\n")
    config = {"kinds": [{"label": "dflash", "recipe": str(recipe)},
                        {"label": "dflash8k", "recipe": str(recipe)},
                        {"label": "eagle3", "recipe": str(tmp_path / "gone.yaml")}],
              "eval": {"methods": {"drafter_chain@dflash": "DFlash (block chain)"},
                       "passes": {"v": {"methods": ["drafter_chain@dflash8k",
                                                    "drafter_chain@eagle3", "prompt_lookup"]}}}}
    names = method_names(bench_of(config=config))
    assert names["drafter_chain@dflash8k"] == "DFlash (block chain) [dflash8k]"
    assert "drafter_chain@eagle3" not in names and "prompt_lookup" not in names  # raw ids stay
    # records written before records named their data count as the shared data's
    shared = {"a": record_of(), "b": record_of(data={"folder": "runs/x/data"})}
    assert not _own_data(shared)
    assert _own_data({**shared, "c": record_of(data={"folder": "runs/x/data-5k"})})


def test_the_quantized_rows_say_how_far_they_followed_the_copys_own_decoding():
    from draftsmith.bench.report_sections import variant_divergence

    check = {"checked": ["prompt_lookup", "prompt_lookup (int8 target)"],
             "failures": [{"method": "prompt_lookup (int8 target)", "set": "mt_bench", "item": 81,
                           "index": 1}]}
    (line,) = variant_divergence(check)
    assert "prompt_lookup (int8 target) first left it on mt_bench/81 at new token 1" in line
    assert "one scale over all of its rows" in line
    assert "In bf16" not in line
    wo = {"checked": ["prompt_lookup (int8wo target)"], "dtype_exact": False,
          "failures": [{"method": "prompt_lookup (int8wo target)", "set": "gsm8k", "item": 2,
                        "index": 28}]}
    (line,) = variant_divergence(wo)
    assert "at new token 28" in line and "In bf16 near-tied logits flip" in line
    assert "one scale over all of its rows" not in line
    assert variant_divergence({**wo, "dtype_exact": True})[0].endswith("(float32: a bug).")
    check["failures"] = []
    assert variant_divergence(check) == ["All 1 methods over the quantized copies reproduced that "
                                         "copy's own plain greedy decoding token for token."]
    assert variant_divergence({"checked": ["prompt_lookup"], "failures": []}) == []


def test_an_older_int8_record_gets_what_was_measured_not_its_stored_claim():
    from draftsmith.eval.report import format_variant_table

    row = {"tau": 1.0, "tokens_per_second": 10.0, "speedup": 1.0, "acceptance_by_depth": []}
    variants = {
        "none": {"quantization": None, "summary": {"all": {"plain": row}},
                 "verified_output": "the target as loaded: float32 weights as loaded"},
        "int8": {"quantization": {"scheme": "int8", "description": "dynamic int8 linears"},
                 "summary": {"all": {"plain": row}},
                 "verified_output": "lossless with respect to this quantized model"}}
    text = format_variant_table(variants)
    assert "lossless with respect to" not in text
    assert ("int8: verified output is the int8 copy of the target (float32 weights as loaded, "
            "then dynamic int8 linears), not the target as loaded; activation scales") in text
    variants["int8"]["quantization"]["row_independent"] = False  # written today: as stored
    assert "lossless with respect to" in format_variant_table(variants)


@pytest.mark.parametrize("spec", [
    {"methods": ["prompt_lookup"], "check_lossless": "yes"},
    {"methods": ["prompt_lookup"], "check_lossless": True, "limit": 0},
    {"methods": ["prompt_lookup"], "max_new_tokens": True},
    {"methods": ["prompt_lookup"], "title": ["a", "list"]},
    {"methods": ["prompt_lookup"], "autotune_tree": "yes"},
])
def test_bad_lossless_passes_are_clear_errors(tmp_path, spec):
    config = write_configs(tmp_path, eval={"methods": {"prompt_lookup": "prompt lookup"},
                                           "passes": {"lossless": spec}})
    with pytest.raises(DraftsmithError, match="check_lossless: true, limit: 3"):
        load_bench_config(config)


def test_the_training_table_says_when_medusa_heads_share_the_target_head(tmp_path):
    from draftsmith.bench.report import shared_head

    recipe = tmp_path / "medusa1.yaml"
    recipe.write_text(yaml.safe_dump({"drafter": {"kind": "medusa", "shared_head": True}}))
    assert shared_head(record_of(kind="medusa", recipe=str(recipe)))  # older: its recipe says
    assert not shared_head(record_of(kind="medusa", shared_head=False, recipe=str(recipe)))
    assert not shared_head(record_of(kind="eagle3", recipe=str(recipe)))
    assert not shared_head(record_of(kind="medusa", recipe=str(tmp_path / "gone.yaml")))


def test_drafters_with_data_of_their_own_list_it_in_the_training_table(tmp_path):
    from draftsmith.bench.report import _training_table, bench_name
    from draftsmith.bench.run import data_folder, kind_recipe

    path = write_configs(tmp_path)
    raw = yaml.safe_load(path.read_text())
    own = tmp_path / "more.yaml"
    own.write_text((tmp_path / "data.yaml").read_text())
    raw["kinds"]["eagle1-more"] = {"recipe": raw["kinds"]["eagle1"]["recipe"], "data": str(own),
                                   "budget_minutes": 2}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    config = load_bench_config(path)
    entry = config.kind("eagle1-more")
    assert entry.budget_minutes == 2 and data_folder(config, entry).name == "data-more"
    assert kind_recipe(config, entry)["data"]["out_dir"] == str(data_folder(config, entry))
    assert data_folder(config, config.kind("eagle1")).name == "data"
    record = {"kind": "eagle1", "features": "online", "steps": 5, "batch_size": 2,
              "seconds_per_step": 1.0, "train_minutes": 1.0, "held_out": {}}
    table = _training_table(bench_of(training={
        "eagle1": {**record, "data": {"folder": "a", "conversations": 1708, "tokens": 514008}},
        "eagle1-more": {**record, "tokens_seen": 775000,
                        "data": {"folder": "b", "conversations": 11144, "tokens": 3100000,
                                 "regenerated": 3072}}}))
    assert "conversations | tokens | tokens seen (epochs)" in table[0]
    assert "| 11,144 (3,072 answered by the target) | 3,100,000 | 775,000 (0.25) |" in table[3]
    assert "| 1,708 | 514,008 | – |" in table[2]  # a record from before tokens_seen was kept
    assert "conversations" not in _training_table(bench_of(training={"eagle1": record}))[0]
    assert bench_name({"target": NAME, "name": "x-scaling"}) == "x-scaling"
    assert bench_name({"target": NAME, "name": None}) == NAME
    raw["kinds"]["eagle1-more"]["budget_minutes"] = 0
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(DraftsmithError, match=r"budget_minutes = 0(\.0)? must be > 0"):
        load_bench_config(path)


def test_a_target_not_measured_in_this_run_keeps_its_committed_results(tmp_path, monkeypatch):
    from draftsmith.bench.report import earlier_benches, write_benchmarks

    name = "qwen2.5-coder-1.5b-instruct"
    (tmp_path / "benchmarks" / name).mkdir(parents=True)
    (tmp_path / "benchmarks" / name / "bench.json").write_bytes(
        (ROOT / "benchmarks" / name / "bench.json").read_bytes())
    monkeypatch.chdir(tmp_path)
    assert earlier_benches({name}) == []  # measured now: its own run's results are used
    kept = earlier_benches({NAME})
    assert [b.config["target"] for b, run_dir in kept] == [name] and kept[0][1] is None
    write_benchmarks(kept, tmp_path / "B.md", tmp_path / "none.json", [])
    lines = (tmp_path / "B.md").read_text().splitlines()
    at = lines.index(f"## {name}")
    assert lines[at + 2].startswith("Measured on ") and lines[at + 4].startswith("*Kept from an "
                                                                                 "earlier run*")
    assert "### Training" in "\n".join(lines[at:])


def test_a_run_without_evaluation_keeps_the_committed_results(tmp_path, monkeypatch, capsys):
    """`--stages data` (or train, engine) publishes nothing over the last full run's files."""
    import draftsmith.bench.run as bench_run

    config = write_configs(tmp_path)
    committed = tmp_path / "benchmarks" / NAME
    committed.mkdir(parents=True)
    (committed / "bench.json").write_bytes((ROOT / "benchmarks" / NAME / "bench.json").read_bytes())
    (committed / "eval_t0.json").write_text("{}")
    monkeypatch.chdir(tmp_path)

    def data_only(bench_config, stages):
        assert stages == ("data",)
        path = tmp_path / "run" / "bench.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": {"target": NAME}, "data": None, "training": {},
                                    "curves": {}, "eval": {}, "passes": {}, "engines": {}}))
        return path

    monkeypatch.setattr(bench_run, "run_bench", data_only)
    assert main(["bench", "--config", str(config), "--stages", "data"]) == 0
    assert "keep the committed run (add `eval` to --stages" in capsys.readouterr().out
    assert (committed / "eval_t0.json").is_file()
    assert json.loads((committed / "bench.json").read_text())["eval"]  # not the data-only payload
    lines = (tmp_path / "BENCHMARKS.md").read_text().splitlines()
    assert lines[lines.index(f"## {NAME}") + 4].startswith("*Kept from an earlier run*")
    # the preamble names the kept section's config too, not only this run's
    assert "`recipes/bench/smollm2-135m.yaml`" in next(x for x in lines if "Per-target" in x)


def test_the_hybrid_is_not_the_best_trained_drafter_but_has_its_own_bar_line():
    from draftsmith.bench.report_findings import bars

    rows = {"plain": {"speedup": 1.0}, "prompt_lookup": {"speedup": 1.4},
            "drafter_dynamic@eagle3": {"speedup": 1.1}, "drafter_lookup@eagle3": {"speedup": 1.5}}
    bench = bench_of(config={"speedup_bar": 1.6, "eval": {"methods": {
        "prompt_lookup": "prompt lookup", "drafter_dynamic@eagle3": "EAGLE-3",
        "drafter_lookup@eagle3": "EAGLE-3 + prompt lookup"}}},
        eval={"0": {"summary": {"gsm8k": rows, "all": rows}}})
    lines, missed = bars(bench)
    assert "| best trained drafter speedup (EAGLE-3) | >= 1.6x | 1.10x | missed |" in lines
    assert "| best trained drafter faster than prompt lookup | > 1.40x | 1.10x | missed |" in lines
    assert "| EAGLE-3 + prompt lookup faster than prompt lookup | > 1.40x | 1.50x | met |" in lines
    assert missed == ["best trained-drafter speedup 1.10x misses 1.6x by 0.50x."]


def test_relative_bars_compare_one_method_with_another():
    from draftsmith.bench.report_findings import bars

    def row(speedup, draft):
        return {"speedup": speedup, "time_split": {"draft": draft}}

    rows = {"plain": row(1.0, 0.0), "drafter_dynamic@eagle3": row(1.2, 0.12),
            "drafter_dynamic@dflash": row(1.25, 0.05), "drafter_chain@dflash": row(0.9, 0.03)}
    names = {"drafter_dynamic@eagle3": "EAGLE-3", "drafter_dynamic@dflash": "DFlash",
             "drafter_chain@dflash": "DFlash chain"}
    relative = [
        {"method": "drafter_dynamic@dflash", "metric": "speedup", "than": "drafter_dynamic@eagle3"},
        {"method": "drafter_chain@dflash", "metric": "speedup", "than": "drafter_dynamic@eagle3"},
        {"method": "drafter_dynamic@dflash", "metric": "draft_share",
         "than": "drafter_dynamic@eagle3", "factor": 0.333}]
    bench = bench_of(config={"relative_bars": relative, "eval": {"methods": names}},
                     eval={"0": {"summary": {"gsm8k": rows, "all": rows}}})
    lines, missed = bars(bench)
    assert lines[2:] == [
        "| DFlash speedup > EAGLE-3's | > 1.20x | 1.25x | met |",
        "| DFlash chain speedup > EAGLE-3's | > 1.20x | 0.90x | missed |",
        "| DFlash draft-time share <= 0.333 x EAGLE-3's | <= 4.0% | 5.0% | missed |"]
    assert missed == ["DFlash chain: speedup 0.90x against EAGLE-3's 1.20x.",
                      "DFlash: draft-time share 5.0% against 0.333 x EAGLE-3's 12.0%."]


def test_a_training_log_with_a_torn_last_line_is_read_without_it(tmp_path, capsys):
    rows = [{"step": s, "seconds": 0.5 * s, "loss": 1.0} for s in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "seco')
    assert [r["step"] for r in _metrics(tmp_path)] == [1, 2, 3, 4]
    assert "dropped its half-written last line" in capsys.readouterr().out
    assert seconds_per_step(_metrics(tmp_path)) == pytest.approx(0.5)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(DraftsmithError, match=r"metrics.jsonl:2 is not a metrics row"):
        _metrics(tmp_path)


def test_a_data_scaling_run_plots_tau_against_conversations(tmp_path):
    from draftsmith.bench.report_plots import scaling_points, write_plots

    def row(tau, speedup):
        return {"tau": tau, "speedup": speedup}

    summary = {s: {"plain": row(1.0, 1.0), "prompt_lookup": row(1.6, 1.4),
                   "drafter_dynamic@small": row(1.5, 1.1), "drafter_dynamic@all": row(1.9, 1.3),
                   "drafter_dynamic@long": row(2.1, 1.4), "drafter_dynamic@all-1024": row(1.8, 1.2),
                   "drafter_dynamic@regen": row(2.0, 1.35)}
               for s in ("gsm8k", "all")}
    training = {label: {"kind": "eagle3", "budget_minutes": minutes, "max_length": length,
                        "data": {"folder": label, "conversations": n, "regenerated": regen}}
                for label, n, minutes, length, regen in (
                    ("small", 1708, 12, 384, None), ("all", 11144, 12, 384, 0),
                    ("long", 11144, 45, 384, None), ("all-1024", 11144, 12, 1024, None),
                    ("regen", 11100, 12, 384, 3000))}
    bench = bench_of(config={"target": NAME, "eval": {"methods": {}},
                             "train": {"max_length": 384}},
                     training=training, eval={"0": {"summary": summary}})
    points = scaling_points(bench)
    assert points["drafters"][12, None, None] == [
        {"conversations": 1708, "tau": 1.5, "speedup": 1.1},
        {"conversations": 11144, "tau": 1.9, "speedup": 1.3}]
    assert points["drafters"][45, None, None] == [{"conversations": 11144, "tau": 2.1, "speedup": 1.4}]
    # another sequence length is a line of its own, and so is data with the target's answers
    assert points["drafters"][12, 1024, None] == [{"conversations": 11144, "tau": 1.8, "speedup": 1.2}]
    assert points["drafters"][12, None, 3000] == [{"conversations": 11100, "tau": 2.0, "speedup": 1.35}]
    assert points["baselines"] == {"prompt_lookup": {"tau": 1.6, "speedup": 1.4}}
    assert (tmp_path / "scaling.png") in write_plots(bench, tmp_path)
    shared = replace(bench, training={k: replace(v, data={"folder": "one"})
                                      for k, v in bench.training.items()})
    assert scaling_points(shared) is None
    same_count = replace(bench, training={k: replace(v, data={**v.data, "conversations": 11144})
                                          for k, v in bench.training.items()})
    assert scaling_points(same_count) is None  # one x for every point: the tables say it all
