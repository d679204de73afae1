"""Verification arithmetic with hand-written logits, and losslessness of sampling verification.

The chi-square tests use fixed seeds; with a fresh seed each would fail by chance with
probability 1e-4 (the significance level), about 1 in 10,000 runs.
"""

import pytest
import torch
from scipy.stats import chisquare

from draftsmith.decoding.tree import Tree, chain_tree
from draftsmith.decoding.verify import verify_greedy, verify_sampling

V = 6
ALPHA = 1e-4


def one_hot_logits(argmax: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(argmax), V)
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 5.0
    return logits


@pytest.mark.parametrize("target_says, accepted", [
    ([0, 0, 0, 0, 5], 0),     # never: first draft (1) differs from the target's 0
    ([1, 2, 3, 4, 5], 4),     # always: every draft matches, bonus 5
    ([1, 2, 0, 0, 0], 2),     # partial: two accepted, then the target says 0
])
def test_greedy_chain_acceptance(target_says, accepted):
    tree = chain_tree(9, [1, 2, 3, 4])
    path, nxt = verify_greedy(tree, one_hot_logits(target_says))
    assert path == list(range(accepted + 1))
    assert nxt == target_says[accepted]


def test_greedy_tree_takes_the_longest_matching_branch():
    # root 0 -> {1: tok 3, 2: tok 4}; 1 -> 3: tok 5; 2 -> 4: tok 1 -> 5: tok 2
    tree = Tree(tokens=torch.tensor([0, 3, 4, 5, 1, 2]), parents=torch.tensor([-1, 0, 0, 1, 2, 4]),
                depths=torch.tensor([0, 1, 1, 2, 2, 3]))
    # target: after root 4, after node2 1, after node4 2, after node5 0
    argmax = [4, 0, 1, 0, 2, 0]
    path, nxt = verify_greedy(tree, one_hot_logits(argmax))
    assert path == [0, 2, 4, 5] and nxt == 0


def _first_two_tokens(tree, probs, trials, seed=0):
    gen = torch.Generator().manual_seed(seed)
    first = torch.zeros(V)
    second_after = {}
    for _ in range(trials):
        path, nxt = verify_sampling(tree, probs, gen)
        emitted = [*tree.tokens[path[1:]].tolist(), nxt]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second_after.setdefault(emitted[0], torch.zeros(V))[emitted[1]] += 1
    return first, second_after


def _assert_matches(counts, probs):
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token with zero target probability was emitted"
    assert chisquare(counts[keep], expected[keep]).pvalue > ALPHA


def _random_probs(rows, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, V, generator=gen) * 1.5, -1)


def test_sampling_chain_with_draft_distribution_is_lossless():
    target = _random_probs(3, seed=1)
    draft = _random_probs(2, seed=2)
    # The guarantee holds when drafts are sampled from q, so sample them afresh per trial.
    gen = torch.Generator().manual_seed(3)
    first = torch.zeros(V)
    for _ in range(6000):
        d1 = int(torch.multinomial(draft[0], 1, generator=gen))
        d2 = int(torch.multinomial(draft[1], 1, generator=gen))
        tree = chain_tree(0, [d1, d2], draft_probs=draft)
        path, nxt = verify_sampling(tree, target, gen)
        emitted = [*tree.tokens[path[1:]].tolist(), nxt]
        first[emitted[0]] += 1
    _assert_matches(first, target[0])


def test_sampling_tree_with_deterministic_candidates_is_lossless():
    # root with three fixed children, the first of which has two children of its own
    tree = Tree(tokens=torch.tensor([0, 1, 3, 5, 2, 4]), parents=torch.tensor([-1, 0, 0, 0, 1, 1]),
                depths=torch.tensor([0, 1, 1, 1, 2, 2]))
    target = _random_probs(6, seed=4)
    first, second_after = _first_two_tokens(tree, target, 6000)
    _assert_matches(first, target[0])
    # Given the first token was node 1's token, the next one follows the target at node 1.
    _assert_matches(second_after[1], target[1])


def test_sampling_never_emits_a_rejected_impossible_token():
    target = torch.tensor([[0.0, 1.0, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0]])
    tree = chain_tree(0, [3])  # the target gives token 3 zero probability
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        path, nxt = verify_sampling(tree, target, gen)
        assert path == [0] and nxt == 1
