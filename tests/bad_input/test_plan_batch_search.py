"""`plan ... train.batch_size=1000000000` printed nothing and searched every smaller batch
(hours); the search bisects (issue #55)."""

from __future__ import annotations

from dataclasses import replace

from draftsmith.plan import memory
from draftsmith.plan.memory import FITS_BELOW, Settings, changes_that_fit, plan_memory
from draftsmith.plan.shapes import model_shapes
from draftsmith.train.recipe import build_recipe


def test_plan_of_a_huge_batch_bisects_to_the_largest_that_fits(tiny_folder, monkeypatch):
    recipe = build_recipe({"target": {"name": str(tiny_folder)},
                           "drafter": {"kind": "eagle3", "draft_vocab_size": 64, "ttt_steps": 2}})
    shapes = model_shapes(recipe)
    cfg = Settings(batch=1_000_000_000, length=256, target_bytes=2, act_bytes=2)
    budget = int(plan_memory(shapes, replace(cfg, batch=100)).peak / FITS_BELOW) + 1
    calls = []
    plan = memory.plan_memory

    def counted(*args):
        calls.append(1)
        assert len(calls) < 1000, "the batch search plans one batch size after another"
        return plan(*args)

    monkeypatch.setattr(memory, "plan_memory", counted)
    change = changes_that_fit(shapes, cfg, budget, accum=1)[0]
    best = change.settings.batch
    assert change.what.startswith(f"train.batch_size={best} ")
    assert plan(shapes, replace(cfg, batch=best)).peak <= FITS_BELOW * budget
    assert plan(shapes, replace(cfg, batch=best + 1)).peak > FITS_BELOW * budget
    assert best >= 100
