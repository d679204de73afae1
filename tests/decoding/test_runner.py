"""KV cache bookkeeping: after a tree forward and a non-contiguous commit, the cache equals a fresh
forward over the accepted sequence, and logits over a tree equal each path run separately."""

import torch

from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.decoding.tree import Tree, ancestor_mask, path_to

PROMPT = [5, 17, 33, 2, 90, 41, 8]
# root 0 -> 1, 2; 1 -> 3; 2 -> 4 -> 5
TREE = Tree(tokens=torch.tensor([8, 11, 12, 13, 14, 15]), parents=torch.tensor([-1, 0, 0, 1, 2, 4]),
            depths=torch.tensor([0, 1, 1, 2, 2, 3]))


def _tree_forward(model):
    runner = CausalLMRunner(model)
    runner.reset()
    runner.forward(torch.tensor(PROMPT[:-1]))
    runner.commit()
    out = runner.forward(TREE.tokens, runner.length + TREE.depths,
                         ancestor_mask(TREE.parents, TREE.depths))
    return runner, out


def test_tree_logits_equal_each_path_alone(tiny_model):
    _, out = _tree_forward(tiny_model)
    for node in range(TREE.size):
        path = path_to(node, TREE.parents.tolist())
        ids = torch.tensor([PROMPT[:-1] + TREE.tokens[path].tolist()])
        expected = tiny_model(ids).logits[0, -1]
        torch.testing.assert_close(out.logits[node], expected, rtol=1e-4, atol=1e-5)


def test_cache_after_non_contiguous_commit_equals_fresh_forward(tiny_model):
    runner, _ = _tree_forward(tiny_model)
    path = [0, 2, 4, 5]
    runner.commit(path)
    accepted = PROMPT[:-1] + TREE.tokens[path].tolist()
    fresh = CausalLMRunner(tiny_model)
    fresh.reset()
    fresh.forward(torch.tensor(accepted))
    fresh.commit()
    assert runner.length == len(accepted)
    for kept, ref in zip(runner.cache.layers, fresh.cache.layers, strict=True):
        torch.testing.assert_close(kept.keys, ref.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(kept.values, ref.values, rtol=1e-4, atol=1e-5)
    # and decoding continues exactly as from the fresh cache
    nxt = torch.tensor([3])
    torch.testing.assert_close(runner.forward(nxt).logits, fresh.forward(nxt).logits,
                               rtol=1e-4, atol=1e-5)


def test_rollback_drops_uncommitted_entries(tiny_model):
    runner, _ = _tree_forward(tiny_model)
    runner.rollback()
    assert runner.length == len(PROMPT) - 1
    assert all(layer.keys.shape[-2] == runner.length for layer in runner.cache.layers)
