"""Medusa decoding: head k's top-k tokens fill depth k+1 of a static tree of rank paths.

Heads read the target's last hidden state at the last accepted position (the one whose logits
chose the root), so after each verification the proposer keeps that node's hidden state.
"""

from __future__ import annotations

import torch

from draftsmith.decoding.proposers.base import Proposer, TreeSettings, register_family
from draftsmith.decoding.proposers.tree_expansion import DEFAULT_CHOICES, chain_choices
from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.tree import Tree, root_only_tree, static_tree_choices, tree_from_lists
from draftsmith.models.contracts import HeadsDrafterModule


class MedusaProposer:
    """Static-tree proposer from Medusa heads.

    Args:
        heads: a trained MedusaHeads module.
        choices: tree as top-k rank paths; depth is capped by the number of heads.
    """

    name = "medusa"
    needs_hidden_states = False

    def __init__(self, heads: HeadsDrafterModule, choices: tuple[tuple[int, ...], ...] = DEFAULT_CHOICES,
                 name: str = "medusa"):
        self.heads = heads
        self.name = name
        depth = len(heads.heads)
        self.choices = tuple(c for c in choices if len(c) <= depth)
        self.hidden: torch.Tensor | None = None  # the state whose logits chose the root

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        self.hidden = target_out.last_hidden[-1]

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        choices = [c for c in self.choices if len(c) <= max_depth]
        ordered, parents = static_tree_choices(choices)
        device = next(self.heads.parameters()).device
        if len(ordered) == 1:
            return root_only_tree(root, device)
        logits = self.heads(self.hidden[None, None])[:, 0, 0]  # (K, V)
        widest = max(c[-1] for c in ordered[1:]) + 1
        top = logits.topk(widest, dim=-1).indices.tolist()  # (K, widest)
        tokens = [root] + [top[len(c) - 1][c[-1]] for c in ordered[1:]]
        depths = [len(c) for c in ordered]
        return tree_from_lists(tokens, parents, depths, device)

    def skip(self, root: int) -> None:
        """This step's tree came from elsewhere: the heads read only the next accepted state."""

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        self.hidden = target_out.last_hidden[path[-1]]


@register_family("heads")
def heads_family(module: HeadsDrafterModule, tree: TreeSettings, name: str) -> Proposer:
    """Parallel heads on the last hidden state (Medusa): a static tree or a chain of top-1s."""
    choices = chain_choices(tree.chain_length) if tree.shape == "chain" else DEFAULT_CHOICES
    return MedusaProposer(module, choices, name)
