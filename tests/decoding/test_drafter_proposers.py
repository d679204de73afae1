"""Trained-drafter proposers (Medusa, EAGLE-1 static / EAGLE-2 dynamic, EAGLE-3, MTP, DFlash and
DSpark chains and trees) are lossless
on tiny targets, alone and inside the prompt-lookup hybrid, and a drafter's decode-time predictions
equal its training-time ones (the cache, positions and features are aligned), also when the hybrid
handed some steps to prompt lookup."""

from __future__ import annotations

import pytest
import torch

from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import TreeSettings
from draftsmith.decoding.proposers.block_drafter import BlockDrafterProposer
from draftsmith.decoding.proposers.feature_drafter import FeatureDrafterProposer
from draftsmith.decoding.proposers.hybrid import LookupHybridProposer
from draftsmith.decoding.proposers.medusa import MedusaProposer
from draftsmith.decoding.proposers.mtp import MTPProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.proposers.tree_expansion import (
    DEFAULT_CHOICES,
    DynamicTreeConfig,
    chain_choices,
)
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.models.features import target_features
from draftsmith.models.layers import causal_mask, shift_left
from draftsmith.registry import get_spec
from tests.helpers.tiny_targets import tiny_target

NEW = 30
EAGLE31 = {"fc_norm": True, "norm_output": True}


def drafter_for(kind, target, **settings):
    spec = get_spec(kind)
    torch.manual_seed(1)
    module = spec.build(target.config, spec.make_config(settings))
    module.init_from_target(target)
    # random drafters are near-uniform; sharpen so trees differ from one step to the next
    for param in module.parameters():
        if param.requires_grad and param.dim() == 2:
            param.data *= 4
    return module.eval().requires_grad_(False)


def proposers(target):
    medusa = drafter_for("medusa", target, num_heads=3)
    eagle1 = drafter_for("eagle1", target)
    eagle3 = drafter_for("eagle3", target, draft_vocab_size=100)
    eagle31 = drafter_for("eagle3", target, draft_vocab_size=100, **EAGLE31)
    mtp = drafter_for("mtp", target, num_modules=3)
    dflash = drafter_for("dflash", target, block_size=5, num_layers=2)
    reduced = drafter_for("dflash", target, block_size=5, num_layers=2, draft_vocab_size=60)
    kept = torch.randperm(128, generator=torch.Generator().manual_seed(2))[:60].sort().values
    reduced.set_draft_vocab(kept - torch.arange(60), torch.zeros(128, dtype=torch.bool).index_fill(
        0, kept, True))
    reduced.init_from_target(target)  # the head rows of the installed vocabulary
    dspark = drafter_for("dspark", target, block_size=4, num_layers=1, markov_rank=8)
    doubting = drafter_for("dspark", target, block_size=4, num_layers=1, markov_rank=8,
                           confidence_threshold=0.6)
    block_tree = TreeSettings("dynamic", dynamic=DynamicTreeConfig(3, 4, 9))
    return {
        "dflash_chain": BlockDrafterProposer(dflash, TreeSettings("chain"), "dflash_chain"),
        "dflash_dynamic": BlockDrafterProposer(dflash, block_tree, "dflash_dynamic"),
        "dflash_vocab_chain": BlockDrafterProposer(reduced, TreeSettings("chain"), "vocab_chain"),
        "dflash_vocab_dynamic": BlockDrafterProposer(reduced, block_tree, "vocab_dynamic"),
        "dspark_chain": BlockDrafterProposer(dspark, TreeSettings("chain"), "dspark_chain"),
        "dspark_confidence_cut": BlockDrafterProposer(doubting, TreeSettings("chain"), "cut"),
        "dspark_dynamic": BlockDrafterProposer(dspark, block_tree, "dspark_dynamic"),
        "mtp_chain": MTPProposer(mtp),
        "medusa_static": MedusaProposer(medusa),
        "eagle1_static": FeatureDrafterProposer(eagle1, DEFAULT_CHOICES),
        "eagle1_chain": FeatureDrafterProposer(eagle1, chain_choices(4)),
        "eagle2_dynamic": FeatureDrafterProposer(eagle1, dynamic=DynamicTreeConfig(3, 4, 10)),
        "eagle3_dynamic": FeatureDrafterProposer(eagle3, dynamic=DynamicTreeConfig(3, 5, 12)),
        "eagle3_static": FeatureDrafterProposer(eagle3, DEFAULT_CHOICES),
        "eagle31_dynamic": FeatureDrafterProposer(eagle31, dynamic=DynamicTreeConfig(3, 5, 12)),
    }


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_drafter_proposers_reproduce_plain_greedy(family):
    target = tiny_target(family)
    prompt = torch.randint(2, 128, (18,), generator=torch.Generator().manual_seed(3)).tolist()
    reference = target.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    runner = CausalLMRunner(target, output_hidden_states=True)
    for name, proposer in proposers(target).items():
        result = generate(runner, proposer, prompt, NEW)
        assert result.tokens == reference, name
        assert max(result.depth_per_step) >= 1, f"{name} never drafted"


@pytest.mark.parametrize("length", [1, 2])
def test_very_short_prompts_decode_losslessly(length):
    """A one-token prompt has no target feature before the root: the first step verifies the
    root alone, drafting starts from the second."""
    target = tiny_target("llama")
    prompt = [7, 11][:length]
    reference = target.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    runner = CausalLMRunner(target, output_hidden_states=True)
    for name, proposer in proposers(target).items():
        result = generate(runner, proposer, prompt, NEW)
        assert result.tokens == reference, f"{name} with a {length}-token prompt"
        assert max(result.depth_per_step) >= 1, f"{name} never drafted"


# a prompt that repeats itself, so prompt lookup finds 2- and 3-token matches from the start
REPEATING = [5, 9, 17, 33, 8, 5, 9, 17, 40, 41, 5, 9, 17, 33, 8, 60, 5, 9]


def hybrid(proposer, min_ngram: int = 2) -> LookupHybridProposer:
    return LookupHybridProposer(proposer, PromptLookupProposer(4, 3), min_ngram, "hybrid")


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_lookup_hybrid_reproduces_plain_greedy_for_every_drafter(family):
    target = tiny_target(family)
    reference = target.generate(torch.tensor([REPEATING]), max_new_tokens=NEW, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, len(REPEATING):].tolist()
    runner = CausalLMRunner(target, output_hidden_states=True)
    for name, proposer in proposers(target).items():
        wrapped = hybrid(proposer)
        result = generate(runner, wrapped, REPEATING, NEW)
        assert result.tokens == reference, name
        assert wrapped.lookup_steps >= 1 and wrapped.drafter_steps >= 1, name


def test_the_lookup_hybrid_refuses_a_match_length_lookup_never_finds():
    with pytest.raises(ValueError, match="n-gram range"):
        hybrid(MTPProposer(drafter_for("mtp", tiny_target("llama"), num_modules=2)), min_ngram=4)


class TreeRecorder:
    """Wraps a proposer and records (root position, proposed tree) at every step it drafts."""

    def __init__(self, inner):
        self.inner, self.name, self.rows = inner, inner.name, []
        self.needs_hidden_states = inner.needs_hidden_states

    def reset(self, context, target_out):
        self.position = len(context)
        self.inner.reset(context, target_out)

    def propose(self, root, max_depth):
        tree = self.inner.propose(root, max_depth)
        self.rows.append((self.position, tree))
        return tree

    def skip(self, root):
        self.inner.skip(root)

    def observe(self, path_tokens, target_out, path):
        self.position += len(path_tokens)
        self.inner.observe(path_tokens, target_out, path)


@pytest.mark.parametrize("with_lookup", [False, True])
@pytest.mark.parametrize("kind, settings", [("eagle1", {}), ("eagle3", {"draft_vocab_size": 100}),
                                             ("eagle3", {"draft_vocab_size": 100, **EAGLE31})],
                         ids=["eagle1", "eagle3", "eagle3.1"])
def test_decode_time_drafts_equal_training_time_predictions(kind, settings, with_lookup):
    """With the hybrid, steps prompt lookup drafted leave their entries for the drafter's next
    step: its drafts must still equal what training computes at the same positions."""
    target = tiny_target("llama")
    drafter = drafter_for(kind, target, **settings)
    prompt = torch.randint(2, 128, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    recorder = TreeRecorder(FeatureDrafterProposer(drafter, dynamic=DynamicTreeConfig(3, 1, 3)))
    proposer = hybrid(recorder, min_ngram=3) if with_lookup else recorder
    result = generate(CausalLMRunner(target, output_hidden_states=True), proposer,
                      REPEATING if with_lookup else prompt, 16)
    prompt = REPEATING if with_lookup else prompt
    if with_lookup:
        assert proposer.lookup_steps >= 2

    sequence = torch.tensor([prompt + result.tokens])
    mask = torch.ones_like(sequence)
    spec = get_spec(kind)
    features = target_features(target, sequence, mask, mask,
                               spec.aux_layers(target.config.num_hidden_layers, drafter.config))
    t = sequence.shape[1]
    positions = torch.arange(t)[None]
    with torch.no_grad():
        if kind == "eagle3":
            _, logits, _ = drafter.step(shift_left(sequence, 1), drafter.fuse(features.aux_hidden),
                                        positions, causal_mask(t, sequence.device))
            logp = torch.full((t, 128), float("-inf"))
            logp[:, drafter.draft_ids()] = torch.log_softmax(logits[0], -1)
        else:
            predicted, _ = drafter.step(shift_left(sequence, 1), features.last_hidden, positions,
                                        causal_mask(t, sequence.device))
            logp = torch.log_softmax(drafter.logits(predicted[0]), -1)
    rows = [(position, tree) for position, tree in recorder.rows if tree.scores is not None]
    assert len(rows) > 3  # (the last step may be the root alone, without scores)
    for root_position, tree in rows:
        first = (tree.depths == 1).nonzero().flatten()
        tokens, scores = tree.tokens[first], tree.scores[first]
        # the root sits at root_position; training position root_position - 1 predicts the token
        # after the root from (root, feature of the position before it)
        torch.testing.assert_close(scores, logp[root_position - 1, tokens], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("with_lookup", [False, True])
def test_mtp_decode_time_drafts_equal_training_time_predictions(with_lookup):
    target = tiny_target("qwen2")
    drafter = drafter_for("mtp", target, num_modules=3)
    prompt = (REPEATING if with_lookup else
              torch.randint(2, 128, (12,), generator=torch.Generator().manual_seed(6)).tolist())
    recorder = TreeRecorder(MTPProposer(drafter))
    proposer = hybrid(recorder, min_ngram=3) if with_lookup else recorder
    result = generate(CausalLMRunner(target), proposer, prompt, 20)
    if with_lookup:
        assert proposer.lookup_steps >= 2
    full = prompt + result.tokens
    checked = 0
    for root, tree in recorder.rows:
        drafts = tree.tokens[1:].tolist()
        # teacher-force the verified prefix up to the root followed by this step's own drafts:
        # module k at position root - 1 must reproduce draft k
        sequence = torch.tensor([full[:root + 1] + drafts])
        mask = torch.ones_like(sequence)
        t = sequence.shape[1]
        hidden = target_features(target, sequence, mask, mask, []).last_hidden
        with torch.no_grad():
            for k, token in enumerate(drafts):
                hidden, logits, _ = drafter.module_step(
                    k, shift_left(sequence, k + 1), hidden, torch.arange(t)[None],
                    causal_mask(t, sequence.device))
                assert token == int(logits[0, root - 1].argmax()), (root, k)
                checked += 1
    assert checked >= 2 * len(recorder.rows)
