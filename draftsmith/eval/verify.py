"""Verification of a draft tree against the target's outputs: greedy and lossless sampling.

Both return the accepted path (node indices from the root) and the next token, which is the
target's own choice after the last accepted node (the "bonus" token), so every step emits at least
one token and the output is exactly what the target alone would produce.
"""

from __future__ import annotations

import torch

from draftsmith.eval.sampling import SamplingConfig, logits_to_probs
from draftsmith.eval.tree import Tree


def verify(tree: Tree, target_logits: torch.Tensor, sampling: SamplingConfig,
           generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """`verify_greedy` at temperature 0, else `verify_sampling` on the tempered distribution.

    Args:
        tree: the verified tree (n nodes).
        target_logits: (n, V) target logits at every node.
        sampling: temperature / top-p.
        generator: random source of sampling verification.
    """
    if sampling.greedy:
        return verify_greedy(tree, target_logits)
    return verify_sampling(tree, logits_to_probs(target_logits, sampling), generator)


def verify_greedy(tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Longest root path whose tokens all equal the target's argmax at their parent.

    Args:
        tree: the verified tree (n nodes).
        target_logits: (n, V) target logits at every node.

    Returns:
        `(path, next_token)`: accepted node indices starting with 0, and the target's argmax
        after the last of them.
    """
    argmax = target_logits.argmax(-1).tolist()
    if tree.size == 1:
        return [0], argmax[0]
    tokens = tree.tokens.tolist()
    parents = tree.parents.tolist()
    if tree.is_chain:
        path = [0]
        for i in range(1, len(tokens)):
            if tokens[i] != argmax[i - 1]:
                break
            path.append(i)
        return path, argmax[path[-1]]
    accepted = [True] + [False] * (len(tokens) - 1)
    depths = tree.depths.tolist()
    best = 0
    for i in range(1, len(tokens)):
        p = parents[i]
        if accepted[p] and tokens[i] == argmax[p]:
            accepted[i] = True
            if depths[i] > depths[best]:
                best = i
    path = [best]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1], argmax[best]


def verify_sampling(
    tree: Tree, target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[list[int], int]:
    """Recursive rejection sampling over the tree; the emitted tokens follow the target exactly.

    At a node with target distribution p, its children are tried in order. A child x drawn from
    the draft distribution q (row of `tree.draft_probs`) is accepted with probability
    min(1, p(x)/q(x)); a deterministic candidate (no draft_probs) with probability p(x). After a
    rejection p becomes norm(max(0, p - q)) (q a point mass for deterministic candidates). When
    a child is accepted the walk continues from it; when all are rejected, or at a leaf, the next
    token is sampled from the current p.

    Args:
        tree: the verified tree.
        target_probs: (n, V) target distribution at every node (after temperature / top-p).
        generator: random source (CPU generator).

    Returns:
        `(path, next_token)` as in `verify_greedy`.
    """
    probs = target_probs.float().cpu()
    draft = tree.draft_probs.float().cpu() if tree.draft_probs is not None else None
    tokens = tree.tokens.tolist()
    children: list[list[int]] = [[] for _ in tokens]
    for i, p in enumerate(tree.parents.tolist()):
        if p >= 0:
            children[p].append(i)
    node, path = 0, [0]
    while True:
        p = probs[node]
        for child in children[node]:
            x = tokens[child]
            u = float(torch.rand((), generator=generator))
            q = None if draft is None else draft[child]
            q_x = 1.0 if q is None else float(q[x])
            if q_x > 0 and u < min(1.0, float(p[x]) / q_x):
                node = child
                path.append(child)
                break
            if q is None:
                p = p.clone()
                p[x] = 0.0
            else:
                p = (p - q).clamp(min=0)
            # p - q sums to zero only when p <= q everywhere, where rejection cannot happen.
            p = p / p.sum().clamp(min=1e-30)
        else:
            return path, int(torch.multinomial(p, 1, generator=generator))
