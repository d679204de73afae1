"""Tree structure: ancestor masks, static choices, the EAGLE-2 rerank."""

import pytest
import torch

from draftsmith.decoding.tree import (
    ancestor_mask,
    build_dynamic_tree,
    chain_tree,
    path_to,
    static_tree_choices,
)


def test_ancestor_mask_of_a_small_tree():
    #      0
    #    1   2
    #    3     4
    #    5
    parents = torch.tensor([-1, 0, 0, 1, 2, 3])
    depths = torch.tensor([0, 1, 1, 2, 2, 3])
    mask = ancestor_mask(parents, depths)
    expected = torch.zeros(6, 6, dtype=torch.bool)
    for node in range(6):
        for j in path_to(node, parents.tolist()):
            expected[node, j] = True
    assert torch.equal(mask, expected)
    assert mask[5].nonzero().flatten().tolist() == [0, 1, 3, 5]


def test_chain_tree_is_a_chain():
    tree = chain_tree(7, [1, 2, 3])
    assert tree.is_chain and tree.tokens.tolist() == [7, 1, 2, 3]
    assert tree.parents.tolist() == [-1, 0, 1, 2] and tree.max_depth == 3
    assert torch.equal(ancestor_mask(tree.parents, tree.depths), torch.ones(4, 4).tril().bool())


def test_static_choices_sorted_with_parents():
    ordered, parents = static_tree_choices([(1,), (0, 0), (0,), (0, 1), (0, 0, 0)])
    assert ordered == [(), (0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    assert parents == [-1, 0, 0, 1, 1, 3]
    with pytest.raises(ValueError, match="no parent"):
        static_tree_choices([(0,), (1, 0)])


def test_dynamic_rerank_keeps_best_connected_nodes():
    # candidates: 0,1 children of root; 2,3 children of 0; 4 child of 2
    scores = torch.tensor([-0.1, -2.0, -0.3, -0.2, -0.5])
    tokens = torch.tensor([10, 11, 12, 13, 14])
    parents = torch.tensor([-1, -1, 0, 0, 2])
    out_tokens, out_parents, depths, out_scores = build_dynamic_tree(scores, tokens, parents, 4)
    assert out_tokens.tolist() == [-1, 10, 12, 13, 14]
    assert out_parents.tolist() == [-1, 0, 1, 1, 2]
    assert depths.tolist() == [0, 1, 2, 2, 3]
    assert torch.allclose(out_scores, torch.tensor([0.0, -0.1, -0.3, -0.2, -0.5]))
