"""Offline training (hidden states read from the data pipeline's cache) gives the same drafter as
online training (the target inside each step), in fp32 on a tiny target."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.data.cache import build_feature_cache
from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.render import RenderedSample
from draftsmith.models.target_states import hidden_key
from draftsmith.train.loop import run_training
from draftsmith.train.recipe import build_recipe
from tests.helpers.state import reset_accelerate
from tests.helpers.tiny_targets import tiny_target

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


class Tokenizer:
    """Just enough of a tokenizer for the cache's identity check."""

    def get_vocab(self):
        return {f"t{i}": i for i in range(128)}


@pytest.mark.parametrize("kind, settings", [("eagle3", {"draft_vocab_size": 128, "ttt_steps": 2}),
                                            ("medusa", {"num_heads": 2})])
def test_offline_cache_training_equals_online(kind, settings, tmp_path):
    target = tiny_target("llama")
    gen = torch.Generator().manual_seed(0)
    samples = [RenderedSample(torch.randint(2, 128, (16,), generator=gen).tolist(),
                              [0] * 4 + [1] * 12, str(i)) for i in range(16)]
    build_feature_cache(target, Tokenizer(), samples, tmp_path / "cache", kinds=[kind],
                        dtype="float32", progress=False)
    n = target.config.num_hidden_layers
    cache = FeatureCache.open(tmp_path / "cache")
    cached = list(cache.iter_samples(keys=[hidden_key(i) for i in cache.layers]))
    online = [{"input_ids": s.input_ids, "loss_mask": s.loss_mask} for s in samples]
    assert f"hidden_states.{n}" in cached[0]

    def train(examples, name):
        reset_accelerate()
        recipe = build_recipe({"drafter": {"kind": kind, **settings},
                               "train": {"batch_size": 4, "max_steps": 3, "warmup_steps": 0,
                                         "lr": 1e-3, "eval_fraction": 0.0,
                                         # float32: `auto` is bf16 autocast on native-bf16 CPUs
                                         "mixed_precision": "no",
                                         "output_dir": str(tmp_path / name)}})
        return load_file(run_training(recipe, examples, target=target) / "model.safetensors")

    a, b = train(online, "online"), train(cached, "offline")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind, settings", [("eagle3", {"draft_vocab_size": 128, "ttt_steps": 2}),
                                            ("medusa", {"num_heads": 2})])
def test_offline_training_reads_only_the_embeddings_and_head(kind, settings, tiny_folder,
                                                             tmp_path):
    """`train` with offline features loads the target's input embeddings and output head only
    (the rest stays on meta) and trains the same drafter as with the whole target."""
    from draftsmith.data.identity import TargetIdentity
    from draftsmith.target.load import TargetSpec
    from draftsmith.train.target_parts import load_loss_parts

    spec = TargetSpec(name=str(tiny_folder), dtype="float32")
    whole, parts = spec.load(), load_loss_parts(spec, "cpu")
    read = {n for n, p in parts.model.named_parameters() if not p.is_meta}
    assert read == {"model.embed_tokens.weight", "lm_head.weight"}
    # the cache made with the whole target accepts it as the same target
    assert TargetIdentity.of(parts.model, parts.tokenizer) == \
        TargetIdentity.of(whole.model, whole.tokenizer)
    gen = torch.Generator().manual_seed(0)
    samples = [RenderedSample(torch.randint(2, 128, (16,), generator=gen).tolist(),
                              [0] * 4 + [1] * 12, str(i)) for i in range(8)]
    build_feature_cache(whole.model, Tokenizer(), samples, tmp_path / "cache", kinds=[kind],
                        dtype="float32", progress=False)
    cache = FeatureCache.open(tmp_path / "cache")
    cached = list(cache.iter_samples(keys=[hidden_key(i) for i in cache.layers]))

    def train(target, name):
        reset_accelerate()
        recipe = build_recipe({"drafter": {"kind": kind, **settings},
                               "train": {"batch_size": 4, "max_steps": 2, "warmup_steps": 0,
                                         "lr": 1e-3, "eval_fraction": 0.0,
                                         "mixed_precision": "no",
                                         "output_dir": str(tmp_path / name)}})
        return load_file(run_training(recipe, cached, target=target) / "model.safetensors")

    a, b = train(whole.model, "whole"), train(parts.model, "parts")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6)
