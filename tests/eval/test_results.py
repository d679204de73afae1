"""eval.json and bench.json are types with a schema version and one reader (issue 51): what the
writer writes reads back equal; every committed result, written before the schema had a
version, still reads; a damaged, foreign or newer file is refused with one message naming the
file, what is wrong and the command that writes it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.eval.results import (
    BENCH_SCHEMA,
    EVAL_SCHEMA,
    BenchResults,
    EvalResults,
    TrainingRecord,
    read_bench_results,
    read_eval_results,
    read_training_record,
    write_bench_results,
    write_eval_results,
    write_training_record,
)

ROOT = Path(__file__).resolve().parents[2]
ROW = {"runs": 2, "new_tokens": 20, "seconds": 1.0, "tokens_per_second": 20.0, "tau": 1.5,
       "acceptance_by_depth": [0.5], "speedup": 1.0}


def run(**parts) -> EvalResults:
    """A small eval run as `draftsmith eval` writes it."""
    return EvalResults(**{"config": {"methods": ["plain", "prompt_lookup"], "limit": 1},
                          "summary": {s: {"plain": ROW, "prompt_lookup": {**ROW, "speedup": 1.2}}
                                      for s in ("gsm8k", "all")},
                          "hardware": "a CPU", "date": "2026-12-06T05:00:00+00:00",
                          "commit": "abc1234", "torch": "2.9.0",
                          "records": [{"method": "plain", "set_name": "gsm8k"}], **parts})


def test_what_the_writers_write_reads_back_equal(tmp_path):
    results = run(batch_sizes={"1": {"plain": {"speedup": 1.0}}})
    path = write_eval_results(tmp_path / "eval.json", results)
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == EVAL_SCHEMA and next(iter(raw)) == "schema_version"
    assert "per_prompt" not in raw and "batch_records" not in raw  # empty parts left out
    assert read_eval_results(path) == results
    assert read_eval_results(path).methods == ["plain", "prompt_lookup"]
    record = TrainingRecord(label="a", kind="eagle3", steps=3, seconds_per_step=1.5,
                            budget_minutes=7, train_minutes=6.9, batch_size=4, features="online",
                            held_out={"acc_0": 0.5}, recipe="runs/b/recipes/a.yaml")
    bench = BenchResults(config={"target": "t"}, training={"a": record},
                         eval={"0": run(records=[], per_prompt={"gsm8k": {"prompts": []}})},
                         passes={"batch": results})
    path = write_bench_results(tmp_path / "bench.json", bench)
    assert json.loads(path.read_text())["schema_version"] == BENCH_SCHEMA
    back = read_bench_results(path)
    assert back == bench and back.greedy.per_prompt == {"gsm8k": {"prompts": []}}
    assert "records" not in json.loads(path.read_text())["eval"]["0"]
    assert "tokens_seen" not in json.loads(path.read_text())["training"]["a"]  # not recorded
    assert read_training_record(write_training_record(tmp_path / "budget.json", record)) == record


def test_every_committed_result_still_reads():
    benches = sorted(ROOT.glob("benchmarks/*/bench.json"))
    evals = sorted(ROOT.glob("benchmarks/*/eval_*.json"))
    # most were written before versions (no schema_version); newer ones carry theirs
    assert benches and evals and any("schema_version" not in json.loads(path.read_text())
                                     for path in benches)
    for path in benches:
        bench = read_bench_results(path)
        assert bench.greedy is not None and "plain" in bench.greedy.methods
        assert BenchResults.from_dict(bench.to_dict(), str(path)) == bench
    for path in evals:
        assert read_eval_results(path).summary["all"]


def refused(tmp_path, content, name: str = "eval.json") -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    reader = read_eval_results if name == "eval.json" else read_bench_results
    with pytest.raises(DraftsmithError) as caught:
        reader(path)
    message = str(caught.value)
    assert str(path) in message and "re-run" in message, message
    return message


@pytest.mark.parametrize(("content", "problem"), [
    ('{"config": {}, "summ', "it is not JSON, damaged or cut short"),
    ([1, 2], "it holds a JSON list, not an object"),
    ({"curves": {}, "result": 3}, "keys no eval.json has: curves, result"),
    ({"config": {}, "summary": {"all": {}}}, "it lacks hardware, date, commit, torch"),
    ({**run().to_dict(), "schema_version": EVAL_SCHEMA + 1},
     f"it follows schema {EVAL_SCHEMA + 1}, newer than this draftsmith's {EVAL_SCHEMA}); "
     "upgrade draftsmith, or re-run"),
    ({**run().to_dict(), "schema_version": "1"}, "schema_version '1' is no version"),
    ({**run().to_dict(), "summary": []}, "`summary` is a JSON list, where an object belongs"),
    ({**run().to_dict(), "commit": 7}, "`commit` is a JSON int, where a string or null belongs"),
    ({**run().to_dict(), "summary": {"gsm8k": {}}}, "its summary has no `all` row of methods"),
])
def test_a_damaged_or_foreign_eval_json_is_refused_naming_it(tmp_path, content, problem):
    assert problem in refused(tmp_path, content)


def test_a_missing_file_and_a_damaged_run_inside_bench_json_are_refused(tmp_path):
    with pytest.raises(DraftsmithError, match=r"nope.json does not exist; re-run the"):
        read_eval_results(tmp_path / "nope.json")
    bench = {"config": {}, "training": {}, "eval": {"0": {"config": {}, "summary": {"all": {}}}}}
    message = refused(tmp_path, bench, "bench.json")
    assert "bench.json (eval.0) is not an eval.json this draftsmith reads (it lacks " in message
    assert "draftsmith bench --config CONFIG" in message
    assert "it lacks training, eval" in refused(tmp_path, {"config": {}}, "bench.json")
    with pytest.raises(DraftsmithError, match=r"a bench.json payload is not a bench.json"):
        BenchResults.coerce({"config": {}})


def test_a_training_record_from_before_some_fields_reads_and_a_foreign_one_is_refused(tmp_path):
    older = {"label": "a", "kind": "medusa", "steps": 10, "seconds_per_step": 2, "recipe": "r",
             "budget_minutes": 7, "train_minutes": 7.1, "batch_size": 4, "features": "offline",
             "held_out": {}, "lora": False, "tokens_per_second": None}
    (tmp_path / "budget.json").write_text(json.dumps(older))
    record = read_training_record(tmp_path / "budget.json")
    assert record.shared_head is None and record.calibrated_seconds_per_step is None
    assert record.seconds_per_step == 2  # a whole number of seconds is a float's value
    (tmp_path / "budget.json").write_text(json.dumps({**older, "steps": "ten", "epochs": 2}))
    with pytest.raises(DraftsmithError, match=r"budget.json is not a training record this "
                       r"draftsmith reads \(keys no training record has: epochs\); delete it"):
        read_training_record(tmp_path / "budget.json")
    (tmp_path / "budget.json").write_text(json.dumps({**older, "steps": "ten"}))
    with pytest.raises(DraftsmithError, match=r"`steps` is a JSON str, where an integer belongs"):
        read_training_record(tmp_path / "budget.json")
