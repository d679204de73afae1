"""`train.overlap_target`: the next batch's target forward on a second thread while the step
trains (`train/target_ahead.py`)."""

from __future__ import annotations

import threading

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.train.loop import run_training
from draftsmith.train.recipe import build_recipe
from draftsmith.train.target_ahead import AHEAD_KEY, check_overlap, features_ahead
from tests.helpers.drafters import small_settings, training_vocab
from tests.helpers.state import reset_accelerate
from tests.helpers.tiny_targets import tiny_target
from tests.train.test_loop import examples, recipe_for

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_each_batch_carries_its_features_started_one_batch_ahead():
    started: list[int] = []
    go = threading.Event()

    def compute(batch):
        started.append(batch["i"])
        if batch["i"] == 1:
            go.wait(5)  # batch 1's features still running when batch 0 is handed out
        return batch["i"] * 10

    stream = features_ahead(({"i": i} for i in range(4)), compute)
    first = next(stream)
    assert first["i"] == 0 and first[AHEAD_KEY].result(timeout=5) == 0
    deadline = threading.Event()
    while started != [0, 1] and not deadline.wait(0.01):
        pass
    assert started == [0, 1], "batch 1's forward starts before batch 0's step"
    go.set()
    rest = list(stream)
    assert [b["i"] for b in rest] == [1, 2, 3]
    assert [b[AHEAD_KEY].result(timeout=5) for b in rest] == [10, 20, 30]


def test_an_error_on_the_target_thread_is_raised_at_its_batch_and_leaving_early_waits():
    def compute(batch):
        if batch["i"] == 2:
            raise ValueError("bad batch 2")
        return batch["i"]

    stream = features_ahead(({"i": i} for i in range(5)), compute)
    got = [next(stream)[AHEAD_KEY].result(timeout=5) for _ in range(2)]
    assert got == [0, 1]
    with pytest.raises(ValueError, match="bad batch 2"):
        next(stream)[AHEAD_KEY].result(timeout=5)
    stream.close()  # leaving early: the pool is shut down, no thread left running
    assert not [t for t in threading.enumerate() if t.name.startswith("draftsmith-target")]


@pytest.mark.parametrize("kind, extra", [
    ("eagle3", {}), ("peagle", {}), ("eagle1", {}), ("mtp", {}), ("medusa", {}), ("dspark", {}),
    ("dflash", {}), pytest.param("dflash", {"draft_vocab_size": 96}, id="dflash-draft-vocab")])
def test_the_target_run_ahead_trains_the_same_drafter(kind, extra, tmp_path, monkeypatch):
    from draftsmith.models.eagle3 import Eagle3Drafter
    from draftsmith.models.peagle import PEagleDrafter

    warmed: list[str] = []  # EAGLE-3's and P-EAGLE's teachers are read on the target's thread
    for cls in (Eagle3Drafter, PEagleDrafter):
        def warm(self, features, original=cls.__dict__["warm_teacher"]):
            warmed.append(threading.current_thread().name)
            return original(self, features)
        monkeypatch.setattr(cls, "warm_teacher", warm)
    target = tiny_target("llama")
    settings = {**small_settings(kind), **extra}
    vocab = training_vocab(kind, settings, target, examples())
    weights, rows = {}, {}
    for overlap in (False, True):
        reset_accelerate()
        recipe = recipe_for(kind, tmp_path / str(overlap), settings, overlap_target=overlap,
                            eval_every=3)
        out = run_training(recipe, examples(), target=target, draft_vocab=vocab)
        weights[overlap] = load_file(out / "model.safetensors")
        rows[overlap] = (tmp_path / str(overlap) / kind / "metrics.jsonl").read_text()
    assert weights[True].keys() == weights[False].keys()
    for key in weights[True]:
        torch.testing.assert_close(weights[True][key], weights[False][key], rtol=0, atol=0)
    strip = [line.split('"seconds"')[0] for line in rows[True].splitlines()]
    assert strip == [line.split('"seconds"')[0] for line in rows[False].splitlines()]
    if kind in ("eagle3", "peagle"):
        assert len(warmed) >= 6 and all(n.startswith("draftsmith-target") for n in warmed)
    else:  # the others compute their teacher in the step (on the thread: no faster on 2 cores)
        assert not warmed


def test_the_default_overlaps_online_features_on_a_cpu_in_one_process():
    train = build_recipe({"drafter": {"kind": "eagle3"}}).train
    assert train.overlap_target is None
    assert train.overlaps_target("cpu", 1)
    assert not train.overlaps_target("cpu", 2) and not train.overlaps_target("cuda", 1)
    offline = build_recipe({"drafter": {"kind": "eagle3"}, "train": {"features": "offline"}})
    assert not offline.train.overlaps_target("cpu", 1)
    on = build_recipe({"drafter": {"kind": "eagle3"}, "train": {"overlap_target": True}})
    assert on.train.overlaps_target("cuda", 4)


def test_overlap_is_refused_where_the_target_cannot_run_ahead(tmp_path):
    with pytest.raises(DraftsmithError, match=r"train\.features=offline reads cached features"):
        build_recipe({"drafter": {"kind": "eagle3"},
                      "train": {"features": "offline", "overlap_target": True}})
    with pytest.raises(DraftsmithError,
                       match=r"train.overlap_target = 3: must be true or false or null"):
        build_recipe({"drafter": {"kind": "eagle3"}, "train": {"overlap_target": 3}})
    target = tiny_target("llama")
    with pytest.raises(DraftsmithError, match="trains the target through LoRA"):
        check_overlap(True, target, joint=True)
    with torch.device("meta"):  # a target whose weights are not all here (sharded, partly loaded)
        partial = torch.nn.Linear(4, 4)
    with pytest.raises(DraftsmithError, match=r"sharded across the processes"):
        check_overlap(True, partial, joint=False)
    check_overlap(None, partial, joint=False)  # the default never refuses: it stays off there
    recipe = recipe_for("medusa", tmp_path, {"num_heads": 2, "lora": True, "lora_r": 4,
                                             "lora_alpha": 8}, overlap_target=True)
    with pytest.raises(DraftsmithError, match="Medusa-2"):
        run_training(recipe, examples(), target=target)
