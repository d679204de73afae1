"""Draft trees: the candidate tokens a target verifies in one forward, and their attention structure.

A tree's node 0 is the root: the last token already chosen but not yet in the target's KV cache.
Every other node is a draft token whose parent comes earlier in the arrays (topological order),
so a root-to-node path always has increasing indices. A chain is a tree where parent = index - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Tree:
    """Candidate tokens to verify.

    Attributes:
        tokens: (n,) token ids; tokens[0] is the root.
        parents: (n,) parent index of each node; parents[0] = -1.
        depths: (n,) distance from the root; depths[0] = 0.
        draft_probs: (n, V) distribution each node's token was sampled from (row 0 unused), or None
            when candidates were chosen deterministically (top-k): verification then treats each
            candidate as a point mass, which keeps sampling lossless for any candidate choice.
        is_chain: True when parents[i] == i - 1 for all i (no custom attention mask needed).
        scores: (n,) the drafter's cumulative log-probability of each node (root 0), when known.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    draft_probs: torch.Tensor | None = None
    is_chain: bool = False
    scores: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depths.max()) if self.size > 1 else 0


def tree_from_lists(tokens: list[int], parents: list[int], depths: list[int],
                    device: torch.device | str) -> Tree:
    """A tree from host lists (node 0 the root), its tensors on `device`."""
    return Tree(tokens=torch.tensor(tokens, dtype=torch.long, device=device),
                parents=torch.tensor(parents, dtype=torch.long, device=device),
                depths=torch.tensor(depths, dtype=torch.long, device=device),
                is_chain=all(p == i - 1 for i, p in enumerate(parents)))


def root_only_tree(root: int, device: torch.device | str) -> Tree:
    """The root alone: the step verifies no draft (plain decoding's one token)."""
    return tree_from_lists([root], [-1], [0], device)


def chain_tree(root: int, drafts: list[int] | torch.Tensor, draft_probs: torch.Tensor | None = None,
               device: torch.device | str = "cpu") -> Tree:
    """A chain: root followed by `drafts` in order. `draft_probs` is (len(drafts), V) or None."""
    if draft_probs is not None:
        device = draft_probs.device
    tokens = torch.tensor([root, *list(map(int, drafts))], dtype=torch.long, device=device)
    n = tokens.shape[0]
    index = torch.arange(n, device=device)
    probs = None
    if draft_probs is not None and n > 1:
        probs = torch.cat([draft_probs.new_zeros(1, draft_probs.shape[-1]), draft_probs], 0)
    return Tree(tokens=tokens, parents=index - 1, depths=index, draft_probs=probs, is_chain=True)


def ancestor_mask(parents: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """(n, n) bool: entry [i, j] is True when j is i or an ancestor of i (the tree attention mask)."""
    n = parents.shape[0]
    index = torch.arange(n, device=parents.device)
    mask = torch.zeros(n, n, dtype=torch.bool, device=parents.device)
    mask[index, index] = True
    walker = parents.clone()
    for _ in range(int(depths.max()) if n > 1 else 0):
        valid = walker >= 0
        mask[index[valid], walker[valid]] = True
        walker = torch.where(valid, parents[walker.clamp(min=0)], walker)
    return mask


def path_to(node: int, parents: list[int]) -> list[int]:
    """Node indices from the root to `node`, inclusive."""
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def static_tree_choices(choices: list[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], list[int]]:
    """Sort Medusa/EAGLE-1 style choices (paths of top-k ranks) and give each one's parent index.

    Returns `(sorted_choices, parents)` with index 0 for the root (the empty path) and
    `parents[i]` the index of `sorted_choices[i][:-1]`.

    Raises:
        ValueError: a choice whose prefix is missing (the tree would be disconnected).
    """
    ordered = [(), *sorted(set(map(tuple, choices)), key=lambda c: (len(c), c))]
    position = {c: i for i, c in enumerate(ordered)}
    parents = [-1]
    for choice in ordered[1:]:
        if choice[:-1] not in position:
            raise ValueError(f"tree choice {choice} has no parent {choice[:-1]} in the choices")
        parents.append(position[choice[:-1]])
    return ordered, parents


def build_dynamic_tree(
    scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, total_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """EAGLE-2 rerank: keep the `total_tokens` candidates with the highest cumulative log-prob.

    Candidates are every node produced during expansion (root excluded), given as flat arrays in
    creation order, parents first. Cumulative scores never increase from parent to child, so the
    selection is connected; ties are broken towards shallower, earlier nodes to keep it so.

    Args:
        scores: (m,) cumulative log-probabilities of the candidates.
        tokens: (m,) candidate token ids.
        parents: (m,) parent candidate index, -1 for children of the root.
        total_tokens: how many draft nodes to keep.

    Returns:
        `(tokens, parents, depths, scores)` of the selected tree including the root at index 0
        (root token set to -1 for the caller to fill, root score 0), in topological order.
    """
    m = scores.shape[0]
    # Sort by score descending, then by creation order (a stable sort), so a parent beats a child
    # it ties with; one host read for the whole selection
    ranked = torch.sort(-scores.float(), stable=True).indices[: min(total_tokens, m)]
    chosen = sorted(ranked.tolist())
    parent_list = parents.tolist()
    new_index = {old: new + 1 for new, old in enumerate(chosen)}
    out_parents = [-1]
    for i in chosen:
        p = parent_list[i]
        if p >= 0 and p not in new_index:
            raise ValueError("candidate scores increase from parent to child: selection disconnected")
        out_parents.append(new_index.get(p, 0))
    depths = [0]
    for i in range(1, len(out_parents)):
        depths.append(depths[out_parents[i]] + 1)
    device = tokens.device
    index = torch.tensor(chosen, dtype=torch.long, device=device)
    out_tokens = torch.cat([tokens.new_full((1,), -1), tokens[index]])
    out_scores = torch.cat([scores.new_zeros(1), scores[index]])
    return (out_tokens, torch.tensor(out_parents, device=device),
            torch.tensor(depths, device=device), out_scores)
