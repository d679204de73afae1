"""`draftsmith plan`: meta-device counting against real models, the memory model's arithmetic and
verdict, the changes it proposes, and the CLI's errors."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import yaml

from draftsmith.cli import main
from draftsmith.errors import DraftsmithError
from draftsmith.plan.gpus import GB, parse_device
from draftsmith.plan.memory import (
    Settings,
    attention_step_bytes,
    changes_that_fit,
    feature_bytes,
    plan_memory,
    verdict,
)
from draftsmith.plan.report import plan_recipe
from draftsmith.plan.shapes import model_shapes, shipped_configs
from draftsmith.registry import get_spec
from draftsmith.train.recipe import build_recipe
from tests.helpers.tiny_targets import tiny_target

RECIPES = ("recipes/llama-3.1-8b/eagle3.yaml", "recipes/qwen3-8b/eagle3.yaml")


def _recipe(folder, **train):
    return build_recipe({"target": {"name": str(folder)},
                         "drafter": {"kind": "eagle3", "draft_vocab_size": 64, "ttt_steps": 3},
                         "train": {"batch_size": 2, "max_length": 64, **train}})


def test_meta_counts_equal_the_real_models(tiny_folder):
    shapes = model_shapes(_recipe(tiny_folder))
    target = tiny_target("llama")
    drafter = get_spec("eagle3").build(target.config, get_spec("eagle3").make_config(
        {"draft_vocab_size": 64, "ttt_steps": 3}))
    assert shapes.target_params == sum(p.numel() for p in target.parameters())
    assert shapes.drafter_trainable == sum(p.numel() for p in drafter.parameters()
                                           if p.requires_grad)
    assert shapes.drafter_frozen == sum(p.numel() for p in drafter.parameters()
                                        if not p.requires_grad)
    assert shapes.drafter_buffer_bytes == sum(b.numel() * b.element_size()
                                              for b in drafter.buffers())
    assert (shapes.hidden, shapes.layers, shapes.draft_vocab, shapes.ttt_steps) == (32, 4, 64, 3)


def test_shipped_8b_configs_give_the_published_parameter_counts():
    assert set(shipped_configs()) == {"meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B"}
    llama = plan_recipe(RECIPES[0]).shapes
    assert llama.target_params == 8_030_261_248  # the model card's count
    assert plan_recipe(RECIPES[1]).shapes.target_params == 8_190_735_360


@pytest.mark.parametrize("recipe", RECIPES)
def test_8b_recipes_fit_an_80gb_gpu(recipe):
    assert plan_recipe(recipe, gpu="h100-80gb", gpus=8).verdict == "fits"


def _settings(**kw):
    return Settings(**{"batch": 2, "length": 256, "target_bytes": 2, "act_bytes": 2, **kw})


def test_verdict_thresholds():
    assert verdict(89 * GB, 100 * GB) == "fits"
    assert verdict(95 * GB, 100 * GB) == "tight"
    assert verdict(101 * GB, 100 * GB) == "does not fit"


def test_math_attention_keeps_the_scores_and_blockwise_does_not(tiny_folder):
    shapes = model_shapes(_recipe(tiny_folder))
    math, transient = attention_step_bytes(shapes, _settings(attention="math"), 2)
    blockwise, none = attention_step_bytes(shapes, _settings(attention="blockwise"), 2)
    scores = 2 * shapes.heads * 256 * 3 * 256 * 4  # (B, heads, T, 3T) float32
    assert transient == 2 * scores and none == 0
    assert math - blockwise >= scores


def test_sharding_and_buckets_follow_the_ranks(tiny_folder):
    shapes = model_shapes(_recipe(tiny_folder))
    one = plan_memory(shapes, _settings())
    ddp = plan_memory(shapes, _settings(processes=4, sharding="ddp"))
    fsdp = plan_memory(shapes, _settings(processes=4, sharding="fsdp"))
    assert ddp.phase("static") - one.phase("static") == shapes.drafter_trainable * 4  # buckets
    assert fsdp.phase("static") < one.phase("static")
    assert plan_memory(shapes, _settings(batch=4)).peak > one.peak


def test_changes_that_fit_each_fit_and_keep_the_global_batch(tiny_folder):
    shapes = model_shapes(_recipe(tiny_folder))
    cfg = _settings(batch=8, length=512, attention="math")
    peak = plan_memory(shapes, cfg).peak
    memory = int(peak * 0.8)
    changes = changes_that_fit(shapes, cfg, memory, accum=2)
    assert changes
    for change in changes:
        assert verdict(change.peak, memory) == "fits"
        assert change.peak == plan_memory(shapes, change.settings).peak
    batch = [c for c in changes if c.what.startswith("train.batch_size")]
    if batch:
        size = batch[0].settings.batch
        assert f"train.grad_accum={-(-16 // size)}" in batch[0].what
    assert changes_that_fit(shapes, replace(cfg, batch=1, length=8), 1, accum=1) == []


def test_checkpointing_lowers_the_peak(tiny_folder):
    shapes = model_shapes(_recipe(tiny_folder))
    plain = plan_memory(shapes, _settings(batch=4, length=512))
    checkpointed = plan_memory(shapes, _settings(batch=4, length=512, checkpointing=True))
    assert checkpointed.peak < plain.peak


def test_device_names_and_sizes():
    assert parse_device("h100-80gb").memory == 80 * GB
    assert parse_device("80GB").memory == 80 * GB
    assert parse_device("24GiB").memory == 24 * 2**30
    assert parse_device("cpu").kind == "cpu"
    with pytest.raises(DraftsmithError, match="a100-40gb"):
        parse_device("h800")


def test_cli_refuses_an_unknown_gpu(capsys):
    assert main(["plan", RECIPES[0], "--gpu", "v100-16gb"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU" in err and "h100-80gb" in err and "80GB" in err


def test_cli_refuses_a_target_without_a_local_config(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"target": {"name": "someone/unknown-model-7b"},
                                      "drafter": {"kind": "eagle3"}}))
    assert main(["plan", str(recipe)]) == 2
    assert "--target-config" in capsys.readouterr().err


def test_cli_prints_the_plan_and_exits_1_when_it_does_not_fit(capsys):
    assert main(["plan", RECIPES[0], "--gpu", "rtx4090-24gb"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "target weights" in out
    assert main(["plan", RECIPES[0], "--gpu", "h100-80gb", "--gpus", "8"]) == 0


def test_kinds_without_training_time_test_are_refused(tiny_folder):
    recipe = build_recipe({"target": {"name": str(tiny_folder)}, "drafter": {"kind": "medusa"}})
    with pytest.raises(DraftsmithError, match="training-time test"):
        model_shapes(recipe)


def test_meta_build_allocates_nothing(tiny_folder):
    from draftsmith.plan.shapes import meta_target, target_config

    config, _ = target_config(str(tiny_folder))
    assert all(p.device == torch.device("meta") for p in meta_target(config).parameters())


def test_a_target_run_ahead_holds_its_forward_beside_the_step(tiny_folder):
    from draftsmith.plan.report import recipe_settings

    recipe = _recipe(tiny_folder)
    shapes = model_shapes(recipe)
    cpu, gpu = parse_device("cpu"), parse_device("h100-80gb")
    assert recipe_settings(recipe, cpu, 1, None).overlap  # the default: a CPU in one process
    assert not recipe_settings(recipe, gpu, 1, None).overlap
    assert not recipe_settings(recipe, cpu, 2, None).overlap
    off = plan_memory(shapes, _settings(batch=4, length=512))
    ahead = plan_memory(shapes, _settings(batch=4, length=512, overlap=True))
    # the thread holds the next batch's forward, then its features and teacher logits, beside
    # the step on this batch
    thread = max(off.phase("forward"), feature_bytes(shapes, off.settings))
    assert ahead.phase("forward") == thread
    assert ahead.peak == off.phase("static") + thread + off.phase("step")
    assert ahead.peak > off.peak
