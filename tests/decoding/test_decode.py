"""The decoding loop is lossless for every proposer and tree shape, and its tau arithmetic is exact."""

from __future__ import annotations

import pytest
import torch

from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import NoDraftProposer
from draftsmith.decoding.proposers.draft_model import DraftModelProposer, DraftModelTreeProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.proposers.tree_expansion import DEFAULT_CHOICES, DynamicTreeConfig
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.decoding.tree import chain_tree
from tests.helpers.tiny_targets import tiny_target

NEW = 40


def proposer_factories(target, family):
    weak = tiny_target(family, seed=1)  # an unrelated draft: low acceptance
    return {
        "plain": lambda: NoDraftProposer(),
        "prompt_lookup": lambda: PromptLookupProposer(num_tokens=4),
        "chain_weak": lambda: DraftModelProposer(weak, num_tokens=3),
        "chain_self": lambda: DraftModelProposer(target, num_tokens=5),
        "static_tree_weak": lambda: DraftModelTreeProposer(weak, DEFAULT_CHOICES),
        "static_tree_self": lambda: DraftModelTreeProposer(target, DEFAULT_CHOICES),
        "dynamic_tree_weak": lambda: DraftModelTreeProposer(weak, dynamic=DynamicTreeConfig(3, 4, 8)),
        "dynamic_tree_self": lambda: DraftModelTreeProposer(
            target, dynamic=DynamicTreeConfig(2, 6, 12)),
    }


def _prompt(seed=0, length=20):
    # a repeated stretch gives prompt lookup something to find
    base = torch.randint(2, 128, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    return base + base[:6]


def _reference(model, prompt, new=NEW, eos=None):
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                         max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_every_proposer_reproduces_plain_greedy(family):
    target = tiny_target(family)
    runner = CausalLMRunner(target)
    for seed in range(2):
        prompt = _prompt(seed)
        reference = _reference(target, prompt)
        for name, make in proposer_factories(target, family).items():
            result = generate(runner, make(), prompt, NEW)
            assert result.tokens == reference, f"{family}/{name} diverged from greedy"
            assert sum(result.tokens_per_step) == NEW - 1  # the first token is the prefill's


def test_self_draft_accepts_everything():
    target = tiny_target("llama")
    result = generate(CausalLMRunner(target), DraftModelProposer(target, num_tokens=4),
                      _prompt(), NEW)
    assert result.accepted_per_step[:-1] == [4] * (len(result.accepted_per_step) - 1)
    # the prefill chose the first token; 5 tokens a step: 8 steps for the other 39
    assert result.steps == 8 and result.tau == (NEW - 1) / 8


class OracleProposer:
    """Proposes `correct` tokens of the known greedy continuation, then `wrong` wrong ones."""

    name = "oracle"
    needs_hidden_states = False

    def __init__(self, continuation, correct, wrong):
        self.continuation, self.correct, self.wrong = continuation, correct, wrong
        self.done = 0

    def reset(self, context, target_out):
        self.done = 1  # the prefill chose the first token, the first root

    def propose(self, root, max_depth):
        good = self.continuation[self.done:self.done + self.correct]
        bad = [(t + 1) % 128 for t in self.continuation[self.done + len(good):][: self.wrong]]
        return chain_tree(root, (good + bad)[:max_depth])

    def observe(self, path_tokens, target_out, path):
        self.done += len(path_tokens)  # accepted drafts + next token (the new root)


@pytest.mark.parametrize("correct, wrong, tau", [(0, 4, 1.0), (4, 0, 5.0), (2, 2, 3.0)])
def test_tau_is_exact_for_never_always_partial(correct, wrong, tau):
    """tau counts the steps' tokens: 45 after the prefill's first token."""
    target = tiny_target("qwen2")
    prompt = _prompt()
    reference = _reference(target, prompt, new=46)
    result = generate(CausalLMRunner(target), OracleProposer(reference, correct, wrong),
                      prompt, 46)
    assert result.tokens == reference
    assert result.tau == tau
    assert set(result.accepted_per_step) == {correct}


def test_eos_mid_tree_and_budget_stop_exactly():
    target = tiny_target("llama")
    prompt = _prompt()
    reference = _reference(target, prompt)
    eos = reference[13]
    expected = reference[: reference.index(eos) + 1]
    for make in proposer_factories(target, "llama").values():
        result = generate(CausalLMRunner(target), make(), prompt, NEW, eos_token_ids=[eos])
        assert result.tokens == expected
        budget = generate(CausalLMRunner(target), make(), prompt, 7)
        assert budget.tokens == reference[:7]


def test_sampling_is_reproducible_and_differs_from_greedy():
    target = tiny_target("llama")
    prompt = _prompt()
    cfg = SamplingConfig(temperature=1.0, seed=7)
    a = generate(CausalLMRunner(target), DraftModelProposer(target, 4, sampling=cfg,
                 generator=torch.Generator().manual_seed(1)), prompt, NEW, sampling=cfg)
    b = generate(CausalLMRunner(target), DraftModelProposer(target, 4, sampling=cfg,
                 generator=torch.Generator().manual_seed(1)), prompt, NEW, sampling=cfg)
    assert a.tokens == b.tokens and len(a.tokens) == NEW
    assert a.tokens != _reference(target, prompt)
