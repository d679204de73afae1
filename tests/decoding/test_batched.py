"""Batched chain decoding: every row's output equals that row's plain greedy output, token for
token, for every chain-capable drafter kind in the registry, the draft model and prompt lookup,
with rows of different prompt lengths that accept different numbers of tokens and finish at
different steps; the KV cache bookkeeping equals a fresh forward per row."""

from __future__ import annotations

import pytest
import torch

from draftsmith.decoding.batched import generate_batch
from draftsmith.decoding.batched_runner import BatchedLMRunner
from draftsmith.decoding.proposers.base import NoDraftProposer
from draftsmith.decoding.proposers.draft_model import DraftModelProposer
from draftsmith.decoding.proposers.feature_drafter import FeatureDrafterProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.proposers.tree_expansion import DEFAULT_CHOICES
from draftsmith.drafter_folder import LoadedDrafter
from draftsmith.errors import DraftsmithError
from draftsmith.eval.methods import make_drafter_proposer
from draftsmith.eval.settings import DecodeSettings
from draftsmith.registry import DRAFTERS
from tests.decoding.test_decode import _prompt, _reference
from tests.helpers.drafters import small_settings
from tests.helpers.export_helpers import build_drafter
from tests.helpers.tiny_targets import tiny_target

NEW = 24
CHAIN_KINDS = [kind for kind, spec in DRAFTERS.items() if "chain" in spec.tree_shapes]


def _prompts():
    """Four prompts of different lengths (a one-token prompt among them)."""
    return [_prompt(0, 20), _prompt(1, 9), [7], _prompt(2, 14)[:17]]


def _factories(target):
    """name -> (proposer factory, whether it needs the target's hidden states)."""
    weak = tiny_target("llama", seed=1, vocab_size=target.config.vocab_size)
    settings = DecodeSettings(num_draft_tokens=3)
    factories = {
        "plain": (NoDraftProposer, False),
        "prompt_lookup": (lambda: PromptLookupProposer(num_tokens=4), False),
        "draft_model_weak": (lambda: DraftModelProposer(weak, num_tokens=3), False),
        "draft_model_self": (lambda: DraftModelProposer(target, num_tokens=4), False),
    }
    for kind in CHAIN_KINDS:
        loaded = LoadedDrafter(kind, build_drafter(kind, target, small_settings(kind)), {})
        factories[f"{kind}_chain"] = (
            lambda loaded=loaded: make_drafter_proposer("drafter_chain", loaded, settings), True)
    return factories


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_every_chain_method_reproduces_each_row_alone(family):
    target = tiny_target(family)
    prompts = _prompts()
    references = [_reference(target, p, NEW) for p in prompts]
    for name, (make, hidden) in _factories(target).items():
        runner = BatchedLMRunner(target, output_hidden_states=hidden)
        result = generate_batch(runner, [make() for _ in prompts], prompts, NEW)
        for row, reference in enumerate(references):
            assert result.rows[row].tokens == reference, f"{family}/{name} row {row}"
        if name != "plain":
            assert max(d for r in result.rows for d in r.depth_per_step) >= 1, f"{name} never drafted"


def test_rows_accept_different_counts_and_finish_at_different_steps():
    """One batch mixes a draft that is always right, one that is mostly wrong and prompt lookup;
    an EOS early in row 0's output ends that row first while the others go on."""
    target = tiny_target("llama")
    weak = tiny_target("llama", seed=1)
    prompts = _prompts()[:3]
    plain = _reference(target, prompts[0], NEW)
    eos = plain[6]  # row 0: the prefill's token, a step of 5, a step cut at the EOS
    references = [_reference(target, p, NEW, eos=eos) for p in prompts]
    assert len(references[0]) == 7 and any(len(r) > 7 for r in references[1:])
    proposers = [DraftModelProposer(target, 4), DraftModelProposer(weak, 3),
                 PromptLookupProposer(4)]
    runner = BatchedLMRunner(target)
    result = generate_batch(runner, proposers, prompts, NEW, eos_token_ids=[eos])
    assert [r.tokens for r in result.rows] == references
    accepted = [set(r.accepted_per_step[:-1]) for r in result.rows]
    assert accepted[0] == {4} and accepted[1] != {4}, "rows accepted the same counts"
    assert result.rows[0].steps < max(r.steps for r in result.rows)
    assert result.new_tokens == sum(len(r) for r in references)


def test_cache_after_ragged_commits_equals_a_fresh_forward_per_row():
    target = tiny_target("qwen2")
    prompts = [_prompt(0, 12), _prompt(1, 5)]
    runner = BatchedLMRunner(target)
    runner.prefill([p[:-1] for p in prompts])
    block = torch.tensor([[prompts[0][-1], 3, 4, 5], [prompts[1][-1], 6, 7, 0]])
    runner.forward_chains(block)
    runner.commit([1, 3])  # row 0 keeps its root, row 1 its root and two drafts
    kept = [[*prompts[0]], [*prompts[1], 6, 7]]
    assert runner.lengths == [len(k) for k in kept] and runner.size == max(runner.lengths)
    for row, sequence in enumerate(kept):
        fresh = target(torch.tensor([sequence]), use_cache=True).past_key_values
        for layer, ref in zip(runner.cache.layers, fresh.layers, strict=True):
            n = len(sequence)
            torch.testing.assert_close(layer.keys[row, :, :n], ref.keys[0], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(layer.values[row, :, :n], ref.values[0],
                                       rtol=1e-4, atol=1e-5)


def test_a_tree_proposer_is_refused_at_batch_size_above_one():
    target = tiny_target("llama")
    drafter = build_drafter("eagle1", target, small_settings("eagle1"))
    prompts = _prompts()[:2]
    proposers = [FeatureDrafterProposer(drafter, DEFAULT_CHOICES) for _ in prompts]
    with pytest.raises(DraftsmithError, match="trees run at batch 1 only"):
        generate_batch(BatchedLMRunner(target, output_hidden_states=True), proposers, prompts, 8)
