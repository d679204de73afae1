"""A hidden-state cache is refused after other weights are saved into the target's folder
(issue #18): the target identity covers the weights, not only path, config and vocabulary."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from draftsmith.data.cache import build_feature_cache
from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.identity import TargetIdentity
from draftsmith.data.render import RenderedSample
from draftsmith.errors import DraftsmithError
from tests.helpers.tiny_targets import tiny_target


class Tokenizer:
    """Just enough of a tokenizer for the identity."""

    def get_vocab(self):
        return {f"t{i}": i for i in range(128)}


def test_cache_is_refused_after_new_weights_in_the_same_folder(tmp_path):
    folder = tmp_path / "target"
    tiny_target("llama", seed=0).save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    samples = [RenderedSample(list(range(2, 18)), [0] * 4 + [1] * 12, "s0")]
    build_feature_cache(model, Tokenizer(), samples, tmp_path / "cache", kinds=["medusa"],
                        dtype="float32", progress=False)
    same = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    FeatureCache.open(tmp_path / "cache", expect=TargetIdentity.of(same, Tokenizer()))

    tiny_target("llama", seed=1).save_pretrained(folder)  # same path, config and vocab
    retrained = AutoModelForCausalLM.from_pretrained(folder)
    identity = TargetIdentity.of(retrained, Tokenizer())
    assert identity.config_sha256 == TargetIdentity.of(model, Tokenizer()).config_sha256
    with pytest.raises(DraftsmithError, match=r"was made with target .*weights [0-9a-f]{12}\), but "
                                              r"the target now is .*Rebuild the cache"):
        FeatureCache.open(tmp_path / "cache", expect=identity)


def test_models_without_files_are_told_apart_by_their_weights():
    first, second = tiny_target("llama", seed=0), tiny_target("llama", seed=1)
    assert TargetIdentity.of(first, Tokenizer()) != TargetIdentity.of(second, Tokenizer())
    assert (TargetIdentity.of(first, Tokenizer())
            == TargetIdentity.of(tiny_target("llama", seed=0, dtype=torch.bfloat16), Tokenizer()))
