"""`train.compile`: the drafter's decoder layer compiled with torch.compile trains to the same
losses as eager (float32, tiny EAGLE-3 on token batches whose shapes change every step), saves
the same parameter names, and a kind without such a layer says so and trains unchanged."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from draftsmith.train.loop import run_training
from tests.helpers.drafters import small_settings
from tests.helpers.state import reset_accelerate
from tests.helpers.tiny_targets import tiny_target
from tests.train.test_loop import examples, recipe_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_accelerate_state")]


def _losses(out_dir) -> list[float]:
    rows = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, rows) if "loss" in r]


def test_a_compiled_decoder_layer_trains_as_eager(tmp_path):
    runs = {}
    for compiled in (False, True):
        reset_accelerate()
        folder = tmp_path / str(compiled)
        recipe = recipe_for("eagle3", folder, {**small_settings("eagle3"),
                                               "draft_vocab_size": 128},
                            compile=compiled, max_steps=3)
        out = run_training(recipe, examples(), target=tiny_target("llama"))
        runs[compiled] = (_losses(folder / "eagle3"), load_file(out / "model.safetensors"))
    (eager, weights), (compiled, compiled_weights) = runs[False], runs[True]
    assert compiled == pytest.approx(eager, rel=1e-4)
    assert set(compiled_weights) == set(weights)


def test_a_kind_without_a_decoder_layer_says_so(tmp_path, capsys):
    recipe = recipe_for("medusa", tmp_path, compile=True, max_steps=2)
    run_training(recipe, examples(), target=tiny_target("llama"))
    assert "train.compile: the medusa drafter has no decoder layer" in capsys.readouterr().out
