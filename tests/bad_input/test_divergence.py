"""A run that diverges stops with one clear error and saves nothing NaN (issue 55): before, a
damaged float8 cache or `train.lr=1e12` ran to the end with loss NaN, exited 0 and saved a drafter
whose tensors were mostly NaN, which `eval` then loaded without a word and `export` refused as "a
draftsmith bug"."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.data.cache import build_feature_cache
from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.render import RenderedSample
from draftsmith.drafter_folder import read_drafter_weights
from draftsmith.errors import DraftsmithError
from draftsmith.train.loop import run_training
from draftsmith.train.recipe import build_recipe
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def examples(n=16, t=16):
    gen = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(2, 128, (t,), generator=gen).tolist(),
             "loss_mask": [0] * 4 + [1] * (t - 4)} for _ in range(n)]


def recipe(tmp_path, **train):
    values = {"batch_size": 4, "max_steps": 6, "warmup_steps": 1, "lr": 1e-3, "save_every": 2,
              "output_dir": str(tmp_path / "run"), "eval_fraction": 0.25, **train}
    return build_recipe({"drafter": {"kind": "eagle1"}, "train": values})


def test_a_huge_learning_rate_stops_at_the_first_non_finite_loss(tmp_path):
    with pytest.raises(DraftsmithError) as caught:
        run_training(recipe(tmp_path, lr=1e12, warmup_steps=0), examples(),
                     target=tiny_target("llama"))
    message = str(caught.value)
    assert "training diverged and stopped" in message and "train.lr=1e+12" in message
    assert "Lower the learning rate" in message
    assert not (tmp_path / "run" / "drafter").exists()  # no NaN drafter saved as a success
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows if "loss" in r)
    for checkpoint in (tmp_path / "run" / "checkpoints").glob("step_*"):
        weights = load_file(checkpoint / "model.safetensors")
        assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())


def test_a_nan_drafter_is_refused_where_it_is_read(tmp_path):
    out = run_training(recipe(tmp_path), examples(), target=tiny_target("llama"))
    weights = load_file(out / "model.safetensors")
    name = next(k for k, v in weights.items() if v.is_floating_point())
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(DraftsmithError, match=rf"tensor\(s\) {name}.* hold NaN or infinite "
                       r"values; the training that wrote it diverged"):
        read_drafter_weights(out)


def test_a_cache_shard_with_a_flipped_byte_is_refused_before_training(tmp_path):
    samples = [RenderedSample(list(range(2, 18)), [0] * 4 + [1] * 12, f"s{i}") for i in range(3)]
    folder = tmp_path / "cache"
    build_feature_cache(tiny_target("llama"), char_tokenizer(), samples, folder, kinds=["eagle1"],
                        dtype="float32", shard_tokens=16, progress=False)
    cache = FeatureCache.open(folder)
    assert cache.checksum_problems() == []
    shard = folder / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x40  # a feature's byte: the size and the header stay as they were
    shard.write_bytes(bytes(data))
    FeatureCache.open(folder)  # the size check alone passes it
    problems = FeatureCache.open(folder).checksum_problems()
    assert len(problems) == 1 and "shard-00001.safetensors does not match the sha256" in problems[0]
    assert FeatureCache.open(folder).checksum_problems(rank=0, world_size=2) == []  # rank 1 reads it


def test_training_refuses_a_damaged_cache_before_its_first_step(tiny_folder, tmp_path):
    from accelerate import Accelerator

    from draftsmith.target.load import TargetSpec
    from draftsmith.train.run import stream_cache

    target = TargetSpec(name=str(tiny_folder), dtype="float32").load()
    samples = [RenderedSample(list(range(2, 18)), [0] * 4 + [1] * 12, f"s{i}") for i in range(4)]
    folder = tmp_path / "cache"
    build_feature_cache(target.model, target.tokenizer, samples, folder, kinds=["eagle1"],
                        dtype="float32", shard_tokens=32, progress=False)
    run = build_recipe({"drafter": {"kind": "eagle1"}, "data": {"cache": {"kinds": ["eagle1"]}},
                        "train": {"batch_size": 1, "features": "offline", "eval_fraction": 0.25,
                                  "output_dir": str(tmp_path / "run")}})
    accelerator = Accelerator(cpu=True)
    stream_cache(run, folder, target, accelerator)  # intact: it streams
    shard = folder / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x40
    shard.write_bytes(bytes(data))
    with pytest.raises(DraftsmithError, match=r"shard-00000.safetensors does not match the sha256"):
        stream_cache(run, folder, target, accelerator)
