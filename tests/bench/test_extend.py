"""A benchmark drafter trained on from another's run (`kinds.LABEL.extends`): the config takes
only a budget, and the extension starts from the base run's last checkpoint before its decay."""

from __future__ import annotations

import json

import pytest
import yaml

from draftsmith.bench.config import load_bench_config
from draftsmith.bench.extend import extension_recipe, seed_extension
from draftsmith.errors import DraftsmithError
from draftsmith.train.checkpoint import CHECKPOINT_FORMAT, complete_checkpoints
from tests.bench.bench_results import bench_of, record_of, run_of
from tests.bench.test_bench import ROOT, write_configs

EAGLE1 = str(ROOT / "recipes/smollm2-135m/eagle1.yaml")


def config_with(tmp_path, kinds):
    return write_configs(tmp_path, kinds=kinds)


def test_an_extension_takes_its_base_s_recipe_and_settings(tmp_path):
    path = config_with(tmp_path, {"eagle1": {"recipe": EAGLE1, "drafter": {"ttt_steps": 2}},
                                  "longer": {"extends": "eagle1", "budget_minutes": 30}})
    longer = load_bench_config(path).kind("longer")
    assert (longer.recipe, longer.drafter, longer.budget_minutes, longer.extends) == (
        EAGLE1, {"ttt_steps": 2}, 30, "eagle1")


@pytest.mark.parametrize(("kinds", "message"), [
    ({"b": {"extends": "eagle1"}, "eagle1": {"recipe": EAGLE1}}, "names no drafter listed before"),
    ({"eagle1": {"recipe": EAGLE1}, "b": {"extends": "eagle1", "train": {"lr": 1}}},
     "takes only budget_minutes"),
    ({"eagle1": {"drafter": {"ttt_steps": 2}}}, r"kinds\.eagle1 needs `recipe: FILE`"),
    ({"eagle1": {"recipe": EAGLE1}, "b": {"extends": "eagle1"}},
     r"budget_minutes \(0\.001\) must exceed eagle1's \(0\.001\)"),
])
def test_bad_extensions_are_clear_errors(tmp_path, kinds, message):
    with pytest.raises(DraftsmithError, match=message):
        load_bench_config(config_with(tmp_path, kinds))


def fake_checkpoint(folder, step, total, spent):
    settings = {"train.warmup_steps": 10, "train.schedule": "wsd", "train.decay_fraction": 0.2,
                "train.max_minutes": 70.0, "train.max_steps": 8000}
    path = folder / "checkpoints" / f"step_{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights")
    (path / "progress.json").write_text(json.dumps({
        "format": CHECKPOINT_FORMAT, "step": step, "total_steps": total, "planned": False,
        "budget": {"spent_seconds": spent, "plans": 9, "anchor": None},
        "scheduler": {"last_epoch": step}, "run": {"settings": settings},
        "data_stream": {"epoch": 0, "batches_done": step}}))


def test_the_extension_starts_from_the_last_checkpoint_before_the_decay(tmp_path):
    """A 2,330-step wsd run decays from step 1,864: of its checkpoints at 1,082, 1,623 and 2,164
    the extension copies 1,623's, the metrics up to it and its minutes, under its own folder; its
    recipe is the base's with its own budget, folder and (only when needed) step ceiling."""
    base_folder, folder = tmp_path / "train" / "a", tmp_path / "train" / "b"
    for step, spent in ((1082, 1900.0), (1623, 2899.0), (2164, 3860.0)):
        fake_checkpoint(base_folder, step, 2330, spent)
    (base_folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 1.0, "tokens": 10}) + "\n" for s in range(1, 2331)))
    recipe = tmp_path / "recipes" / "a.yaml"
    recipe.parent.mkdir()
    recipe.write_text(yaml.safe_dump({"drafter": {"kind": "eagle3"}, "train": {
        "warmup_steps": 10, "schedule": "wsd", "decay_fraction": 0.2, "max_minutes": 70.0,
        "max_steps": 8000, "output_dir": str(base_folder)}}))
    base = record_of(label="a", recipe=str(recipe), seconds_per_step=1.8)
    raw = extension_recipe(base, folder, 110.0, 4)
    assert raw["train"] == {"warmup_steps": 10, "schedule": "wsd", "decay_fraction": 0.2,
                            "max_minutes": 110.0, "max_steps": 8000, "output_dir": str(folder)}
    assert extension_recipe(base, folder, 300.0, 4)["train"]["max_steps"] == 4 * 10000
    lines = []
    seed_extension(base, base_folder, folder, raw, "b", lines.append)
    assert [p.name for p in complete_checkpoints(folder)] == ["step_1623"]
    assert (folder / "checkpoints" / "step_1623" / "model.safetensors").read_bytes() == b"weights"
    steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").open()]
    assert steps == list(range(1, 1624))
    assert json.loads((folder / "attempts.json").read_text()) == [2899.0]
    assert json.loads((folder / "extends.json").read_text())["step"] == 1623
    assert "step-1623 checkpoint (before its decay), 48.3 minutes in, to 110 minutes" in lines[0]
    seed_extension(base, base_folder, folder, raw, "b", lines.append)  # under way: left as it is
    assert len(lines) == 1


def test_an_extension_needs_a_checkpoint_before_the_decay(tmp_path):
    base_folder = tmp_path / "train" / "a"
    fake_checkpoint(base_folder, 2164, 2330, 3860.0)
    raw = {"train": {"warmup_steps": 10, "schedule": "wsd", "decay_fraction": 0.2,
                     "max_minutes": 110.0, "max_steps": 8000}}
    with pytest.raises(DraftsmithError, match=r"none of the checkpoints it kept .* was written "
                       r"before its learning rate began to decay"):
        seed_extension(record_of(label="a"), base_folder, tmp_path / "train" / "b", raw, "b")


def test_the_training_table_names_the_run_an_extension_trained_on():
    from draftsmith.bench.report import _budgets, _training_table

    record = {"kind": "eagle3", "features": "online", "steps": 5, "batch_size": 4,
              "seconds_per_step": 1.8, "train_minutes": 70.0, "held_out": {}, "budget_minutes": 70}
    bench = bench_of(config={"budget_minutes": 70}, training={
        "a": record, "b": {**record, "budget_minutes": 110,
                           "extends": {"label": "a", "step": 1623, "minutes": 48.3}}})
    table = _training_table(bench)
    assert table[2].startswith("| a | eagle3 |") and "tokens seen" not in table[0]
    bench.training["b"].tokens_seen = 4377941
    bench.training["b"].data = {"folder": "d", "tokens": 3199394}
    seen = _training_table(bench)
    assert "| features | tokens seen (epochs) | steps |" in seen[0] and seen[1].count("---") == 14
    assert "| online | 4,377,941 (1.37) | 5 |" in seen[3] and "| online | – | 5 |" in seen[2]
    assert table[3].startswith("| b (a trained on from its step 1,623) | eagle3 |")
    assert _budgets(bench) == "70 / 110"
    assert _budgets(bench_of(config={"budget_minutes": 8})) == "8"  # none trained yet


def test_an_evaluation_runs_again_when_the_config_asks_for_other_methods(tmp_path, monkeypatch):
    """A method added to a finished benchmark (an extension's drafter) is evaluated with the others
    in one run, not left out by the eval.json of the run before it."""
    import draftsmith.eval.evaluate as evaluate
    from draftsmith.bench import run as bench_run
    from draftsmith.eval.results import write_eval_results

    config = load_bench_config(write_configs(tmp_path))
    out = tmp_path / "eval_t0"
    write_eval_results(out / "eval.json", run_of(config={"methods": ["plain", "prompt_lookup"]}))
    ran, lines = [], []

    def fake_eval(cfg, log=print):
        ran.append(cfg.methods)
        write_eval_results(out / "eval.json", run_of(config={"methods": list(cfg.methods)}))

    monkeypatch.setattr(evaluate, "run_eval", fake_eval)
    kept = bench_run.run_eval_stage(config, out, ("prompt_lookup",), print, temperature=0.0)
    assert kept.config["methods"] == ["plain", "prompt_lookup"] and not ran
    again = bench_run.run_eval_stage(config, out, ("prompt_lookup", "lookahead"), lines.append,
                                     temperature=0.0)
    assert ran == [("plain", "prompt_lookup", "lookahead")]
    assert again.config["methods"] == ["plain", "prompt_lookup", "lookahead"]
    assert "evaluated plain, prompt_lookup; the config now asks for plain, prompt_lookup, " \
        "lookahead: evaluating them all again" in lines[0]


def test_the_pace_of_a_resumed_run_is_timed_on_each_process_s_own_clock():
    """Rows after a resume count seconds from the resuming process's start: steps 1-3 at 1 s a
    step on the first clock, steps 4-6 at 2 s a step on the second (its first step holding the
    setup), so the pace is (2 + 4) s over 4 timed steps, whether the resume is marked by its row
    or (older logs) only by the clock going back."""
    from draftsmith.bench.train_pace import run_seconds_per_step, timed_spans, tokens_per_second

    def steps(*times):
        return [{"step": s, "loss": 1.0, "seconds": t, "tokens": 100} for s, t in times]

    marked = [*steps((1, 5.0), (2, 6.0), (3, 7.0)), {"step": 3, "resumed": 1},
              {"step": 3, "eval/acc_0": 0.5}, *steps((4, 30.0), (5, 32.0), (6, 34.0))]
    older = [*steps((1, 5.0), (2, 6.0), (3, 7.0)), *steps((4, 3.0), (5, 5.0), (6, 7.0))]
    for rows in (marked, older):
        assert [len(span) for span in timed_spans(rows)] == [3, 3]
        assert run_seconds_per_step(rows) == 1.5
        assert tokens_per_second(rows) == 400 / 6.0
    assert run_seconds_per_step(marked[:1]) is None and tokens_per_second(marked[:1]) is None
