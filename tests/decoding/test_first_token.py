"""Every decoding family takes the first new token from the prompt's prefill, as plain decoding
does, so it is plain decoding's first token even where a multi-token forward rounds the target's
logits otherwise than a one-token forward (bf16 kernels, a GPU's kernel choice per shape)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import NoDraftProposer
from draftsmith.decoding.proposers.draft_model import DraftModelProposer, DraftModelTreeProposer
from draftsmith.decoding.proposers.lookahead import LookaheadProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.proposers.rest import RestProposer
from draftsmith.decoding.proposers.tree_expansion import DEFAULT_CHOICES, DynamicTreeConfig
from draftsmith.decoding.runner import CausalLMRunner, ForwardOutput
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.drafter_folder import LoadedDrafter
from draftsmith.eval.methods import make_proposer
from draftsmith.eval.settings import DecodeSettings
from draftsmith.registry import DRAFTERS
from tests.decoding.test_decode import _prompt
from tests.helpers.drafters import small_settings
from tests.helpers.export_helpers import build_drafter
from tests.helpers.tiny_targets import tiny_target

NEW = 6
ROUNDING = 1e-3  # far below the logits' spread (~1), far above float32 rounding (~1e-6)


class MultiTokenRoundingRunner(CausalLMRunner):
    """The target of a runner whose logits depend on how many positions a forward computes:
    where tokens `a` and `b` tie (identical head rows), a one-position forward (the prefill's
    last token, plain decoding's steps) ranks `a` first by `ROUNDING`, a forward of several
    positions (a verified tree with drafts) ranks `b` first: a near-tie that low-precision
    kernels round one way or the other by the forward's shape."""

    def __init__(self, model, a: int, b: int, **kwargs):
        super().__init__(model, **kwargs)
        self.a, self.b = a, b

    def forward(self, tokens, position_ids=None, tree_mask=None, logits_to_keep=0
                ) -> ForwardOutput:
        out = super().forward(tokens, position_ids, tree_mask, logits_to_keep)
        shift = torch.zeros_like(out.logits[0])
        shift[self.a if out.logits.shape[0] == 1 else self.b] = ROUNDING
        out.logits = out.logits + shift
        return out


class EveryContinuation:
    """A REST index that finds the same continuations whatever the context."""

    def lookup(self, context, depth, max_suffix, min_suffix, max_matches):
        return np.array([[5, 6, 7][:depth], [5, 8, 9][:depth]]), min_suffix


def _tied_target(prompt):
    """A tiny target whose head row of plain decoding's first token `a` is copied into another
    token `b`'s, so the two tie after the prompt; returns (target, a, b)."""
    target = tiny_target("llama")
    a = int(target(torch.tensor([prompt])).logits[0, -1].argmax())
    b = (a + 17) % target.config.vocab_size
    target.lm_head.weight.data[b] = target.lm_head.weight.data[a]
    return target, a, b


def _factories(target):
    """name -> (proposer factory taking the sampling settings, needs hidden states): every
    family, each drafting at its first step."""
    weak = tiny_target("llama", seed=1)
    settings = DecodeSettings(num_draft_tokens=3, hybrid_min_ngram=2, lookup_max_ngram=3)
    factories = {
        "prompt_lookup": (lambda s: PromptLookupProposer(num_tokens=4), False),
        "lookahead": (lambda s: LookaheadProposer(window=3, ngram=3, guesses=2), False),
        "rest": (lambda s: RestProposer(EveryContinuation(), num_tokens=4, depth=3), False),
        "draft_model": (lambda s: DraftModelProposer(
            weak, 3, s, torch.Generator().manual_seed(s.seed + 1)), False),
        "draft_model_static": (lambda s: DraftModelTreeProposer(weak, DEFAULT_CHOICES), False),
        "draft_model_dynamic": (lambda s: DraftModelTreeProposer(
            weak, dynamic=DynamicTreeConfig(2, 3, 6)), False),
    }
    for kind, spec in DRAFTERS.items():
        loaded = LoadedDrafter(kind, build_drafter(kind, target, small_settings(kind)), {})
        for method in (*(f"drafter_{shape}" for shape in spec.tree_shapes), "drafter_lookup"):
            factories[f"{kind}/{method}"] = (
                lambda s, method=method, loaded=loaded: make_proposer(method, settings, s,
                                                                      drafter=loaded), True)
    return factories


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=5)],
                         ids=["greedy", "sampling"])
def test_every_family_takes_the_first_token_from_the_prefill(sampling):
    prompt = _prompt()
    target, a, b = _tied_target(prompt)
    runners = {hidden: MultiTokenRoundingRunner(target, a, b, output_hidden_states=hidden)
               for hidden in (False, True)}
    plain = generate(runners[False], NoDraftProposer(), prompt, NEW, sampling=sampling)
    if sampling.greedy:
        assert plain.tokens[0] == a  # the tie is plain's first choice
    for name, (make, hidden) in _factories(target).items():
        result = generate(runners[hidden], make(sampling), prompt, NEW, sampling=sampling)
        assert result.tokens[0] == plain.tokens[0], f"{name}: first token not plain decoding's"
        if name != "prompt_lookup":  # which drafts only where the text repeats itself
            assert result.depth_per_step[0] >= 1, f"{name} drafted nothing at its first step"
