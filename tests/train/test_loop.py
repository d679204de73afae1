"""The accelerate training loop on tiny targets: every kind trains end to end, a killed run
resumes to the same final weights, and a recipe's overrides and errors behave."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.registry import get_spec
from draftsmith.train.batching import split_examples
from draftsmith.train.loop import run_training
from draftsmith.train.loss_module import LossModule
from draftsmith.train.metrics import simulated_tau
from draftsmith.train.recipe import build_recipe
from tests.helpers.drafters import small_settings, training_cases, training_vocab
from tests.helpers.state import killed_at_step, reset_accelerate
from tests.helpers.tiny_targets import tiny_target

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def examples(n=24, t=20, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        length = t - (i % 5)
        ids = torch.randint(2, 128, (length,), generator=gen).tolist()
        rows.append({"input_ids": ids, "loss_mask": [0] * 4 + [1] * (length - 4)})
    return rows


def recipe_for(kind, tmp_path, settings=None, **train):
    values = {"batch_size": 4, "max_steps": 6, "warmup_steps": 1, "lr": 1e-3,
              "output_dir": str(tmp_path / kind), "eval_fraction": 0.2, **train}
    settings = small_settings(kind) if settings is None else settings
    return build_recipe({"drafter": {"kind": kind, **settings}, "train": values})


def training_on_a_faked_clock(monkeypatch, seconds_per_step, recipe, data, target):
    """`run_training` with a fresh accelerate state and the loop's clock advancing
    `seconds_per_step` at each read (it reads it once per step)."""
    import draftsmith.train.loop as loop

    reset_accelerate()
    clock = iter(range(10_000))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock) * seconds_per_step)
    return run_training(recipe, data, target=target)


@pytest.mark.parametrize("kind, settings", training_cases())
def test_every_kind_trains_and_saves(kind, settings, tmp_path):
    from accelerate.utils import set_seed

    target = tiny_target("llama")
    target_before = {n: p.clone() for n, p in target.named_parameters()}
    recipe = recipe_for(kind, tmp_path, settings)
    vocab = training_vocab(kind, settings, target, examples())
    out = run_training(recipe, examples(), target=target, draft_vocab=vocab)
    weights = load_file(out / "model.safetensors")
    set_seed(recipe.train.seed)  # the drafter the loop started from
    start = get_spec(kind).build(target.config, recipe.drafter_config)
    if vocab is not None:
        start.set_draft_vocab(vocab.d2t, vocab.t2d)
        assert torch.equal(weights["d2t"], vocab.d2t) and torch.equal(weights["t2d"], vocab.t2d)
    start.init_from_target(target)
    for name, param in start.named_parameters():
        moved = not torch.equal(weights[name], param.detach())
        assert moved == param.requires_grad, f"{name}: trainable={param.requires_grad}, moved={moved}"
    for name, param in target.named_parameters():
        assert torch.equal(param, target_before[name]), f"target {name} changed"
    meta = json.loads((out / "draftsmith_drafter.json").read_text())
    assert meta["kind"] == kind and meta["training_steps"] == 6
    assert weights and all(torch.isfinite(w.float()).all() for w in weights.values())
    rows = [json.loads(line) for line in (tmp_path / kind / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
    assert all(r["tokens"] > 0 for r in rows if "loss" in r)  # real tokens of each step
    accs = [rows[-1][f"eval/acc_{k}"] for k in range(8) if f"eval/acc_{k}" in rows[-1]]
    assert accs and rows[-1]["eval/simulated_tau"] == pytest.approx(simulated_tau(accs))


def test_killed_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    target = tiny_target("qwen2")
    data = examples()
    straight = run_training(recipe_for("eagle1", tmp_path / "a", max_steps=8), data, target=target)

    reset_accelerate()
    recipe = recipe_for("eagle1", tmp_path / "b", max_steps=8, save_every=4)
    killed_at_step(monkeypatch, 6, run_training, recipe, data, target=target)
    assert (tmp_path / "b" / "eagle1" / "checkpoints" / "step_4" / "progress.json").is_file()
    resumed = run_training(recipe, data, target=target)
    rows = (tmp_path / "b" / "eagle1" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(r)["step"] for r in rows if '"loss"' in r]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8], "resumed after step 4: one row per step"

    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_recipe_errors_name_the_key_and_the_choices():
    with pytest.raises(DraftsmithError, match="valid"):
        build_recipe({"drafter": {"kind": "eagle3"}, "train": {"learning_rate": 1}})
    with pytest.raises(DraftsmithError, match="eagle3"):
        build_recipe({"drafter": {"kind": "eagle9"}})
    with pytest.raises(DraftsmithError, match=r"train\.batch_size"):
        build_recipe({"drafter": {"kind": "medusa"}, "train": {"batch_size": 0}})
    with pytest.raises(DraftsmithError, match=r"train\.eval_max_samples=0 must be >= 1"):
        build_recipe({"drafter": {"kind": "medusa"}, "train": {"eval_max_samples": 0}})
    recipe = build_recipe({"drafter": {"kind": "medusa"}, "train": {"lr": "1e-4"}})
    assert recipe.train.lr == 1e-4


def test_medusa2_trains_lora_adapters_and_heads_but_not_the_base(tmp_path):
    target = tiny_target("llama")
    base = {n: p.clone() for n, p in target.named_parameters()}
    recipe = build_recipe({"drafter": {"kind": "medusa", "num_heads": 2, "lora": True,
                                       "lora_r": 4, "lora_alpha": 8},
                           "train": {"batch_size": 4, "max_steps": 5, "warmup_steps": 0,
                                     "lr": 1e-2, "output_dir": str(tmp_path / "m2")}})
    out = run_training(recipe, examples(), target=target)
    adapter = load_file(out / "lora" / "adapter_model.safetensors")
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b), "LoRA B starts at zero and must move"
    for name, param in target.named_parameters():  # peft injected the adapters in place
        if "lora_" not in name:
            key = name.replace("base_layer.", "")
            assert torch.equal(param, base[key]), f"base weight {name} changed"
    meta = json.loads((out / "draftsmith_drafter.json").read_text())
    assert meta["lora"] is True
    rows = [json.loads(r) for r in (tmp_path / "m2" / "metrics.jsonl").read_text().splitlines()]
    assert "distill_kl" in rows[0]


def test_max_minutes_sizes_the_run_to_the_measured_step_cost(tmp_path, monkeypatch, capsys):
    """A slower machine (faked clock: 2 s per step instead of 0.5) gets fewer steps, and the
    schedule and the saved total follow the plan; the log ends with the time spent against the
    budget."""
    import draftsmith.train.loop as loop

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loop, "choose_mixed_precision", lambda requested, device: ("no", "test"))

    def run(seconds_per_step, folder):
        recipe = recipe_for("eagle1", folder, max_steps=40, max_minutes=0.2, save_every=5)
        training_on_a_faked_clock(monkeypatch, seconds_per_step, recipe, examples(),
                                  tiny_target("llama"))
        rows = [json.loads(line) for line in (folder / "eagle1" / "metrics.jsonl").open()]
        planned = next(r["planned_steps"] for r in rows if "planned_steps" in r)
        return planned, max(r["step"] for r in rows)

    fast = run(0.5, tmp_path / "fast")
    spent = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("train.max_minutes=0.2: 0:1")]
    assert len(spent) == 1 and "spent (" in spent[0] and f", {fast[1]} steps, from building the " \
        "drafter to saving it" in spent[0]
    slow = run(2.0, tmp_path / "slow")
    assert fast[0] == fast[1] and slow[0] == slow[1]
    assert slow[0] < fast[0] <= 40
    assert 5 <= slow[0] <= 7 and 20 <= fast[0] <= 25  # 12 s at 2 or 0.5 s/step


@pytest.mark.slow
def test_max_minutes_holds_when_steps_get_slower_mid_run(tmp_path, monkeypatch):
    """A real run of 0.15 min (9 s) whose steps triple in cost after the first 15 (a sleep in the
    loss module's forward: 0.04 s, then 0.12 s): the total planned at the early pace (well over
    100 steps) is revised down as the slower pace is measured, every revision logged, and the
    run, final evaluation included, ends within 10% of its budget."""
    import time

    import draftsmith.train.loop as loop

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loop, "choose_mixed_precision", lambda requested, device: ("no", "test"))
    forward, calls = LossModule.forward, []

    def slower_after_15(self, batch):
        calls.append(len(calls))
        time.sleep(0.04 if len(calls) <= 15 else 0.12)
        return forward(self, batch)

    monkeypatch.setattr(LossModule, "forward", slower_after_15)
    recipe = recipe_for("eagle1", tmp_path, max_steps=1000, max_minutes=0.15, warmup_steps=2)
    target = tiny_target("llama")
    start = time.perf_counter()
    run_training(recipe, examples(), target=target)
    seconds = time.perf_counter() - start
    assert abs(seconds - 9.0) <= 0.9, f"{seconds:.2f} s for a 9 s budget"
    rows = [json.loads(line) for line in (tmp_path / "eagle1" / "metrics.jsonl").open()]
    plans = [r for r in rows if "planned_steps" in r]
    revisions = [r for r in plans[1:] if "previous_planned_steps" in r]
    assert len(revisions) == len(plans) - 1 and revisions
    assert all(r["seconds_per_step"] > 0 and r["tokens_per_second"] > 0 for r in plans)
    assert plans[-1]["planned_steps"] < max(r["planned_steps"] for r in plans)
    assert max(r["step"] for r in rows) == plans[-1]["planned_steps"]


def test_a_resumed_budget_run_keeps_its_total_and_its_spent_minutes(tmp_path, monkeypatch):
    """Killed at step 12 of a 0.2-minute run (faked clock, 0.5 s a step), the run resumes from
    its step-10 checkpoint with the total planned then and the 5 s spent before, so it plans no
    other total (restarting the budget would have asked for ~30 steps) and ends with the same
    weights as the run that was never killed."""
    import draftsmith.train.loop as loop

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loop, "choose_mixed_precision", lambda requested, device: ("no", "test"))
    target, data = tiny_target("qwen2"), examples()

    def run(folder):
        recipe = recipe_for("eagle1", folder, max_steps=40, max_minutes=0.2, save_every=5)
        return training_on_a_faked_clock(monkeypatch, 0.5, recipe, data, target)

    def plans(folder):
        rows = [json.loads(line) for line in (folder / "eagle1" / "metrics.jsonl").open()]
        return [r["planned_steps"] for r in rows if "planned_steps" in r], rows[-1]["step"]

    straight = run(tmp_path / "a")
    (total,), last = plans(tmp_path / "a")
    assert last == total
    killed_at_step(monkeypatch, 12, run, tmp_path / "b")
    progress = json.loads((tmp_path / "b" / "eagle1" / "checkpoints" / "step_10"
                           / "progress.json").read_text())
    assert progress["total_steps"] == total and progress["planned"] is False
    assert progress["budget"] == {"spent_seconds": 5.0, "plans": 1, "anchor": None}
    resumed = run(tmp_path / "b")
    assert plans(tmp_path / "b") == ([total], total)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_the_in_memory_split_caps_its_held_out_examples():
    examples = [{"n": i} for i in range(100)]
    _, held = split_examples(examples, 0.3, seed=1)
    capped_train, capped = split_examples(examples, 0.3, seed=1, max_held=5)
    assert len(held) == 30 and len(capped) == 5 and len(capped_train) == 95
    assert {e["n"] for e in capped} < {e["n"] for e in held}  # a subset of the same split


def test_steps_for_budget_arithmetic():
    from draftsmith.train.budget import steps_for_budget

    assert steps_for_budget(2.0, 60, 8, 4, 100) == 30
    assert steps_for_budget(2.0, 60, 8, 4, 20) == 20  # the ceiling wins
    assert steps_for_budget(10.0, 30, 40, 4, 100) == 5  # over budget: one more step, then stop


def test_simulated_tau_arithmetic():
    assert simulated_tau([]) == 1.0
    assert simulated_tau([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert simulated_tau([1.0, 0.0, 1.0]) == 2.0


def test_schedules_shape_the_learning_rate():
    from draftsmith.train.budget import StepSchedule

    cosine, wsd, constant = (StepSchedule(2, 10, kind) for kind in ("cosine", "wsd", "constant"))
    assert [round(cosine(s), 3) for s in (0, 1, 2, 10)] == [0.5, 1.0, 1.0, 0.0]
    assert [wsd(s) for s in (0, 1, 2, 7, 8, 9, 10)] == [0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0]
    assert [constant(s) for s in (2, 9, 10)] == [1.0, 1.0, 1.0]
    with pytest.raises(DraftsmithError, match=r"train\.schedule='step': use one of cosine"):
        build_recipe({"drafter": {"kind": "eagle3"}, "train": {"schedule": "step"}})


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_block_drafters_start_from_the_data_statistics(kind, tmp_path):
    """The loop measures the first batch before training (`init_from_data`): with a learning rate
    too small to move anything, the saved `fc` is still a per-dimension rescaling of each fused
    layer and every layer's output projections are still zero."""
    target = tiny_target("llama")
    out = run_training(recipe_for(kind, tmp_path, lr=1e-12, max_steps=2), examples(),
                       target=target)
    weights = load_file(out / "model.safetensors")
    hidden = target.config.hidden_size
    fc = weights["fc.weight"].float()
    blocks = fc.view(hidden, -1, hidden).transpose(0, 1)
    for block in blocks:
        off_diagonal = block - torch.diag(block.diagonal())
        assert off_diagonal.abs().max() < 1e-6 and block.diagonal().abs().min() > 1e-3
    for name, weight in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            assert weight.abs().max() < 1e-6, name


def _settings_record(**train):
    settings = {"drafter.kind": "eagle1", "train.warmup_steps": 2, "train.schedule": "wsd",
                "train.decay_fraction": 0.2, "train.max_minutes": 70.0, "train.max_steps": 9000,
                **train}
    return {"settings": settings, "target": {"name": "t", "config_sha256": "a",
                                             "weights_sha256": "b"},
            "data": {"examples": 3, "sha256": "c"}, "num_processes": 1}


def test_a_budget_changes_on_resume_only_while_the_schedule_takes_a_new_total(tmp_path):
    """wsd over 100 steps decays from step 80: a checkpoint at step 50 may be resumed with another
    budget (and ceiling), one at step 90 may not (its rates would change), nor one whose total was
    fixed without a budget; the refusal says why."""
    from draftsmith.train.resume import check_same_run

    def progress(step, planned=False, **train):
        return {"step": step, "total_steps": 100, "planned": planned,
                "budget": {"spent_seconds": 60.0, "plans": 3, "anchor": None},
                "run": _settings_record(**train)}

    longer = _settings_record(**{"train.max_minutes": 140.0, "train.max_steps": 20000})
    check_same_run(tmp_path, progress(50), longer)
    with pytest.raises(DraftsmithError, match=r"train\.max_minutes=140\.0 here but 70\.0 in that "
                       r"run.*only while the schedule can still take a new total"):
        check_same_run(tmp_path, progress(90), longer)
    with pytest.raises(DraftsmithError, match=r"train\.max_minutes=140\.0 here but null"):
        check_same_run(tmp_path, progress(50, **{"train.max_minutes": None}), longer)
    with pytest.raises(DraftsmithError, match=r"train\.lr"):  # anything else still must match
        check_same_run(tmp_path, progress(50), _settings_record(
            **{"train.max_minutes": 140.0, "train.lr": 0.5}))


def test_a_budget_run_resumed_with_a_larger_budget_trains_on_to_it(tmp_path, monkeypatch, capsys):
    """Killed at step 12 of a 0.2-minute wsd run (faked clock, 0.5 s a step: about 22 steps), its
    step-10 checkpoint (stable phase) resumed with 0.4 minutes re-plans to about twice the steps,
    says so, and decays at the new end."""
    import draftsmith.train.loop as loop

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loop, "choose_mixed_precision", lambda requested, device: ("no", "test"))
    target, data = tiny_target("llama"), examples()

    def run(minutes):
        recipe = recipe_for("eagle1", tmp_path, max_steps=100, max_minutes=minutes, save_every=5,
                            schedule="wsd", warmup_steps=2)
        return training_on_a_faked_clock(monkeypatch, 0.5, recipe, data, target)

    killed_at_step(monkeypatch, 12, run, 0.2)
    first = json.loads((tmp_path / "eagle1" / "checkpoints" / "step_10" / "progress.json")
                       .read_text())["total_steps"]
    capsys.readouterr()
    run(0.4)
    assert "train.max_minutes=0.4 (the run started with 0.2)" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "eagle1" / "metrics.jsonl").open()]
    steps = [r for r in rows if "loss" in r]
    last = steps[-1]["step"]
    assert 18 <= first <= 24 and 1.7 * first <= last <= 2.3 * first
    assert [r["step"] for r in rows if "resumed" in r] == [10]  # where the clock starts over
    assert steps[-1]["lr"] < 0.2e-3 and max(r["lr"] for r in steps if r["step"] > first) == 1e-3
