"""Verification of a draft tree against the target's outputs: greedy and lossless sampling.

Both return the accepted path (node indices from the root) and the next token, which is the
target's own choice after the last accepted node (the "bonus" token), so every step emits at least
one token and the output is exactly what the target alone would produce.
"""

from __future__ import annotations

import torch

from draftsmith.decoding.sampling import SamplingConfig, logits_to_probs, sample_token
from draftsmith.decoding.tree import Tree


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

    The distributions stay on their device: p(x) and q(x) of every node are read to the host in
    one transfer, and a point mass's rejection renormalises p(x) on the host, so a step reads
    the device once more only for its next token (and once per sibling tried after a sampled
    draft was rejected).

    Args:
        tree: the verified tree.
        target_probs: (n, V) target distribution at every node (after temperature / top-p).
        generator: random source (CPU generator).

    Returns:
        `(path, next_token)` as in `verify_greedy`.
    """
    probs = target_probs.float()
    device = probs.device
    draft = tree.draft_probs.float().to(device) if tree.draft_probs is not None else None
    tokens = tree.tokens.tolist()
    parents = tree.parents.tolist()
    children: list[list[int]] = [[] for _ in tokens]
    for i, p in enumerate(parents):
        if p >= 0:
            children[p].append(i)
    p_at, q_at = [0.0], [1.0]  # p(x) under the parent's distribution and q(x), per node
    if len(tokens) > 1:
        node_tokens = tree.tokens[1:].to(device)
        gathered = [probs[tree.parents[1:].to(device), node_tokens]]
        if draft is not None:
            gathered.append(draft[torch.arange(1, len(tokens), device=device), node_tokens])
        host = torch.stack(gathered).tolist()
        p_at += host[0]
        q_at += host[1] if draft is not None else [1.0] * (len(tokens) - 1)
    uniforms = [0.0, *torch.rand(max(len(tokens) - 1, 0), generator=generator, dtype=torch.float64,
                                 device=generator.device if generator is not None else "cpu"
                                 ).tolist()]
    node, path = 0, [0]
    while True:
        rejected: dict[int, float] = {}  # point masses rejected at this node: token -> p(token)
        residual = None  # p after a sampled draft's rejection (a device vector)
        for child in children[node]:
            x = tokens[child]
            if residual is None:
                p_x = 0.0 if x in rejected else p_at[child] / max(
                    1.0 - sum(rejected.values()), 1e-30)
            else:
                p_x = float(residual[x])
            q_x = q_at[child]  # 1 for a deterministic candidate
            if q_x > 0 and uniforms[child] < min(1.0, p_x / q_x):
                node = child
                path.append(child)
                break
            if draft is None:
                rejected[x] = p_at[child]
            else:
                residual = (_current(probs[node], rejected, residual) - draft[child]).clamp(min=0)
                # p - q sums to zero only when p <= q everywhere, where rejection cannot happen.
                residual = residual / residual.sum().clamp(min=1e-30)
        else:
            current = _current(probs[node], rejected, residual)
            return path, int(sample_token(current, generator))


def _current(row: torch.Tensor, rejected: dict[int, float], residual: torch.Tensor | None
             ) -> torch.Tensor:
    """A node's distribution after the rejections so far (renormalised)."""
    if residual is not None:
        return residual
    if not rejected:
        return row
    row = row.index_fill(0, torch.tensor(list(rejected), device=row.device), 0.0)
    return row / row.sum().clamp(min=1e-30)
