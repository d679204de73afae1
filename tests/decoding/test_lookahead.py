"""Lookahead decoding: its tree holds the Jacobi window and the pool's guesses, n-grams are
collected as the paper describes, and the output is plain greedy decoding's token for token."""

from __future__ import annotations

import pytest
import torch

from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.lookahead import LookaheadProposer
from draftsmith.decoding.runner import CausalLMRunner, ForwardOutput
from draftsmith.decoding.sampling import SamplingConfig
from tests.decoding.test_decode import NEW, _prompt, _reference
from tests.helpers.tiny_targets import FAMILIES, tiny_target

# (W, N, G): the smallest window, 2-grams (pure Jacobi), deep windows, more guesses than columns
SETTINGS = [(1, 2, 1), (3, 3, 2), (4, 4, 4), (5, 3, 8), (2, 5, 3)]


@pytest.mark.parametrize("family", FAMILIES)
def test_lookahead_reproduces_plain_greedy(family):
    target = tiny_target(family)
    runner = CausalLMRunner(target)
    accepted = 0
    for seed in range(2):
        prompt = _prompt(seed)
        reference = _reference(target, prompt)
        for window, ngram, guesses in SETTINGS:
            result = generate(runner, LookaheadProposer(window, ngram, guesses), prompt, NEW)
            assert result.tokens == reference, f"{family} seed {seed} W{window} N{ngram} G{guesses}"
            assert sum(result.tokens_per_step) == NEW - 1  # the first token is the prefill's
            accepted += sum(result.accepted_per_step)
    # random tiny targets fall into loops, which the pool learns: drafts must get accepted
    assert accepted > 0


def _argmax_output(tree_size: int, base: int, vocab: int = 128) -> ForwardOutput:
    """Target outputs whose argmax at node i is token base + i."""
    return ForwardOutput(logits=torch.nn.functional.one_hot(
        torch.arange(tree_size) + base, vocab).float())


def test_window_levels_attention_and_ngram_pool():
    proposer = LookaheadProposer(window=3, ngram=3, guesses=2)
    proposer.reset([10, 11, 12])
    first = proposer.propose(13, max_depth=50)  # warm-up: level 0 only, a chain of W+N-3 tokens
    assert first.size == 1 + 3 and first.is_chain
    proposer.observe([13], _argmax_output(first.size, 20), [0])
    assert proposer.levels[1] == [21, 22, 23]  # the new level, moved one position

    tree = proposer.propose(30, max_depth=50)
    k1, k2 = proposer.levels[0]
    assert tree.tokens.tolist() == [30, k1, k2, 21, 22, 23]
    # level 1's token of column i sees the root, level 0 up to column i, then itself
    assert tree.parents.tolist() == [-1, 0, 1, 0, 1, 2]
    assert tree.depths.tolist() == [0, 1, 2, 1, 2, 3]
    proposer.observe([30], _argmax_output(tree.size, 40), [0])
    # one 3-gram per column: (level 0, level 1, new guess at the column's top node)
    assert proposer.pool == {30: [(21, 43)], k1: [(22, 44)], k2: [(23, 45)]}
    assert proposer.levels == [[22, 23], [43, 44, 45]]

    guessed = proposer.propose(30, max_depth=50)
    assert guessed.tokens[:3].tolist() == [30, 21, 43]  # the guess, verified as a root branch
    assert guessed.parents[:3].tolist() == [-1, 0, 1]
    assert guessed.size == 3 + 2 + 3
    for node in range(1, guessed.size):  # every node sits right after its parent
        assert guessed.depths[node] == guessed.depths[guessed.parents[node]] + 1


def test_pool_keeps_the_latest_guesses_and_the_budget_is_respected():
    proposer = LookaheadProposer(window=2, ngram=2, guesses=2)
    proposer.reset([5])
    for ngram in [(1,), (2,), (1,), (3,)]:
        proposer._remember(7, ngram)
    assert proposer.pool[7] == [(1,), (3,)]  # (2,) was least recently seen
    proposer.pool[7] = [(1, 2, 3)]
    proposer.levels = [[9]]
    tree = proposer.propose(7, max_depth=1)  # the window (depth 1 + ...) fits, guesses are cut
    assert tree.max_depth <= 1
    assert proposer.propose(7, max_depth=0).size == 1


def test_lookahead_sampling_runs_and_is_reproducible():
    target = tiny_target("llama")
    runner = CausalLMRunner(target)
    sampling = SamplingConfig(temperature=0.8, seed=3)
    runs = [generate(runner, LookaheadProposer(3, 3, 3), _prompt(1), NEW, sampling=sampling)
            for _ in range(2)]
    assert len(runs[0].tokens) == NEW and all(0 <= t < 128 for t in runs[0].tokens)
    assert runs[0].tokens == runs[1].tokens
