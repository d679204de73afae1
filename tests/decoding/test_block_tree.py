"""DDTree's best-first tree holds exactly the `budget` most probable nodes of the top-k tree
(positions independent), in topological order, with each node's cumulative score."""

from __future__ import annotations

import itertools

import pytest
import torch

from draftsmith.decoding.proposers.block_drafter import best_first_tree


def brute_force(logprobs: torch.Tensor, budget: int, topk: int) -> list[float]:
    """Scores of the best `budget` rank paths (every path of top-k ranks, any depth)."""
    top = logprobs.topk(topk, dim=-1).values
    scores = []
    for depth in range(1, logprobs.shape[0] + 1):
        for ranks in itertools.product(range(topk), repeat=depth):
            scores.append(sum(float(top[d, r]) for d, r in enumerate(ranks)))
    return sorted(scores, reverse=True)[:budget]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [1, 4, 11])
def test_best_first_tree_keeps_the_most_probable_nodes(seed, budget):
    generator = torch.Generator().manual_seed(seed)
    logprobs = torch.log_softmax(3 * torch.randn(4, 20, generator=generator), -1)
    tree = best_first_tree(7, logprobs, budget, topk=3)
    assert tree.size == budget + 1 and int(tree.tokens[0]) == 7
    parents, depths = tree.parents.tolist(), tree.depths.tolist()
    top = logprobs.topk(3, dim=-1)
    for node in range(1, tree.size):
        assert parents[node] < node and depths[node] == depths[parents[node]] + 1
        expected = float(tree.scores[parents[node]]) + float(
            logprobs[depths[node] - 1, tree.tokens[node]])
        assert float(tree.scores[node]) == pytest.approx(expected, abs=1e-5)
        assert int(tree.tokens[node]) in top.indices[depths[node] - 1].tolist()
    chosen = sorted(tree.scores[1:].tolist(), reverse=True)
    assert chosen == pytest.approx(brute_force(logprobs, budget, 3), abs=1e-5)


def test_best_first_tree_stops_at_the_tree_s_size():
    logprobs = torch.log_softmax(torch.randn(2, 5), -1)
    tree = best_first_tree(1, logprobs, 100, topk=2)
    assert tree.size == 1 + 2 + 4  # two positions of two ranks each


def test_a_draft_vocabulary_s_columns_give_the_target_vocabulary_s_tree():
    """Decoding ranks a draft vocabulary's Vd columns and maps them to target ids: the same nodes,
    tokens and scores as ranking the target's V columns (-inf outside the draft vocabulary)."""
    generator = torch.Generator().manual_seed(4)
    kept = torch.randperm(50, generator=generator)[:12].sort().values  # target ids of 12 columns
    draft = torch.log_softmax(2 * torch.randn(3, 12, generator=generator), -1)
    full = draft.new_full((3, 50), float("-inf"))
    full[:, kept] = draft
    by_columns = best_first_tree(9, draft, 8, topk=3, token_ids=kept)
    by_target = best_first_tree(9, full, 8, topk=3)
    assert by_columns.tokens.tolist() == by_target.tokens.tolist()
    assert by_columns.parents.tolist() == by_target.parents.tolist()
    assert torch.equal(by_columns.scores, by_target.scores)
    assert set(by_columns.tokens[1:].tolist()) <= set(kept.tolist())
