"""Growing draft trees with any autoregressive drafter: static choices and EAGLE-2 dynamic expansion.

The drafter is abstracted as `expand(nodes) -> log-probs`: given tree nodes (token, parent), return
the drafter's next-token log-probabilities after each. Any drafter that can run over a tree (a small
causal LM with tree attention, an EAGLE head) grows static trees (EAGLE-1, a fixed list of top-k
rank paths) or dynamic trees (EAGLE-2: expand the best frontier, rerank every candidate by
cumulative log-prob and keep the top `total_tokens`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from draftsmith.decoding.tree import (
    Tree,
    build_dynamic_tree,
    root_only_tree,
    static_tree_choices,
    tree_from_lists,
)

# expand(tokens (m,), ids, parent_ids) -> (m, V) log-probs of the next token after each node.
# ids are the caller's unique node ids; a parent id of -1 is the root. A parent is always either
# the root or a node passed to an earlier call.
ExpandFn = Callable[[torch.Tensor, list[int], list[int]], torch.Tensor]

# A small static tree for CPUs (13 nodes, depth 5); GPUs afford Medusa/EAGLE's 60-node trees.
DEFAULT_CHOICES: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 0, 0),
)


def chain_choices(length: int) -> tuple[tuple[int, ...], ...]:
    """Static choices of a chain of `length` top-1 drafts."""
    return tuple((0,) * d for d in range(1, length + 1))


@dataclass(frozen=True)
class DynamicTreeConfig:
    """EAGLE-2 expansion settings.

    Attributes:
        topk: children expanded per frontier node, and frontier width.
        depth: expansion rounds (deepest draft token).
        total_tokens: draft nodes kept after the rerank (the verify budget, root excluded).
    """

    topk: int = 4
    depth: int = 6
    total_tokens: int = 16

    def __post_init__(self):
        for field_name in ("topk", "depth", "total_tokens"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name}={getattr(self, field_name)} must be >= 1")


class TreeSlots:
    """The tree nodes a drafter has forwarded into its cache while growing one tree.

    Each node takes the next cache slot; `add` returns which slots each new node attends to (its
    ancestors and itself), built from the parents' rows on the device in one gather, with no
    per-node work on tensors.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.slot: dict[int, int] = {}
        self.depth: dict[int, int] = {-1: 0}
        self.visible = torch.zeros(0, 0, dtype=torch.bool, device=device)  # (S, S)

    def add(self, ids: list[int], parents: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Give nodes `ids` (children of `parents`, -1 = the root) the next slots.

        Returns:
            `(visible, depths)`: (m, S + m) bool over every slot so far, and each node's depth.
        """
        count, m = self.visible.shape[0], len(ids)
        padded = torch.cat([torch.zeros(1, count, dtype=torch.bool, device=self.device),
                            self.visible])  # row 0: the root's children see no tree slot
        index = torch.tensor([self.slot[p] + 1 if p >= 0 else 0 for p in parents],
                             device=self.device)
        rows = torch.cat([padded[index], torch.eye(m, dtype=torch.bool, device=self.device)], 1)
        self.visible = torch.cat([torch.cat([self.visible, torch.zeros(
            count, m, dtype=torch.bool, device=self.device)], 1), rows])
        depths = []
        for row, (node, parent) in enumerate(zip(ids, parents, strict=True)):
            self.slot[node] = count + row
            self.depth[node] = self.depth[parent] + 1
            depths.append(self.depth[node])
        return rows, depths


def grow_static_tree(root: int, root_logprobs: torch.Tensor, expand: ExpandFn,
                     choices: tuple[tuple[int, ...], ...], max_depth: int) -> Tree:
    """Tree of the given top-k rank paths: node (r0, .., rd) is the rd-th best child of its parent."""
    ordered, parents = static_tree_choices([c for c in choices if len(c) <= max_depth])
    n = len(ordered)
    device = root_logprobs.device
    tokens = [root] + [0] * (n - 1)
    depths = [len(c) for c in ordered]
    logprobs: dict[int, torch.Tensor] = {0: root_logprobs}
    for depth in range(1, max(depths) + 1):
        level = [i for i in range(n) if depths[i] == depth]
        need = sorted({parents[i] for i in level if parents[i] not in logprobs})
        if need:
            out = expand(torch.tensor([tokens[i] for i in need], device=device), need,
                         [parents[i] if parents[i] > 0 else -1 for i in need])
            for row, node in enumerate(need):
                logprobs[node] = out[row]
        # one top-k and one host read per level: each parent's ranked children at once
        level_parents = sorted({parents[i] for i in level})
        widest = max(ordered[i][-1] for i in level) + 1
        ranked = torch.stack([logprobs[p] for p in level_parents]).topk(widest).indices.tolist()
        row_of = {p: row for row, p in enumerate(level_parents)}
        for i in level:
            tokens[i] = ranked[row_of[parents[i]]][ordered[i][-1]]
    return tree_from_lists(tokens, parents, depths, device)


def grow_dynamic_tree(root: int, root_logprobs: torch.Tensor, expand: ExpandFn,
                      config: DynamicTreeConfig, max_depth: int) -> Tree:
    """EAGLE-2: beam-like expansion by cumulative log-prob, then a global top-`total_tokens` rerank.

    Every candidate (k at depth 1, k*k per later round) is scored; the k best of each round are
    expanded. Scores are clamped so a child never outscores its parent (keeps the rerank connected).
    """
    depth_limit = min(config.depth, max_depth)
    device = root_logprobs.device
    if depth_limit < 1:
        return root_only_tree(root, device)
    k = config.topk
    top = root_logprobs.float().topk(k)
    cand_scores = [top.values]
    cand_tokens = [top.indices]
    cand_parents = [torch.full((k,), -1, dtype=torch.long, device=device)]
    frontier = torch.arange(k, device=device)  # candidate ids to expand next
    frontier_scores = top.values
    offset = k
    for _ in range(depth_limit - 1):
        all_tokens, all_parents = torch.cat(cand_tokens), torch.cat(cand_parents)
        ids, parent_ids = torch.stack([frontier, all_parents[frontier]]).tolist()  # one host read
        out = expand(all_tokens[frontier], ids, parent_ids).float()  # (k, V)
        child = out.topk(k, dim=-1)
        scores = torch.minimum(frontier_scores[:, None] + child.values, frontier_scores[:, None])
        cand_scores.append(scores.flatten())
        cand_tokens.append(child.indices.flatten())
        cand_parents.append(frontier.repeat_interleave(k))
        best = scores.flatten().topk(k).indices
        frontier = offset + best
        frontier_scores = scores.flatten()[best]
        offset += k * k
    tokens, parents, depths, scores = build_dynamic_tree(
        torch.cat(cand_scores), torch.cat(cand_tokens), torch.cat(cand_parents), config.total_tokens
    )
    tokens[0] = root
    return Tree(tokens=tokens, parents=parents, depths=depths, scores=scores)
