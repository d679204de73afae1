"""Training-time-test attention without a dense mask: EAGLE-3 step j attends causally over block 0
(the real sequence's keys) and to the same position's keys in blocks 1..j.

Written as one masked SDPA (`eagle3.ttt_masks`), no fused kernel accepts it and the math backend
materialises (B, heads, T, (j+1)T) scores and probabilities per step. Here block 0 goes through
SDPA with `is_causal=True` (the fused flash / memory-efficient kernels, no mask) and the diagonal
blocks are computed elementwise, a per-position dot product, (B, heads, T, j). The two are merged
exactly inside the same SDPA call by a *sink* key: one extra key, visible to every query, whose
score for query i is log(sum of exp(diagonal scores of i)) (carried by two extra query/key
coordinates, a high and a low part, so bf16 keeps it exact to ~1e-5) and whose value is a unit
vector in an extra value coordinate. SDPA then returns the block-0 part already renormalised over
block 0 + diagonals, and its extra value coordinate is the diagonals' share of the softmax; the
diagonal values weighted by that share complete the output. Everything is differentiable through
public ops (SDPA's own backward), memory is linear in T, and no mask is built.

Right padding only (as `collate` lays batches out): with real tokens a prefix of each row, plain
causal attention over block 0 equals the padding-aware mask for every real query.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

KV = tuple[torch.Tensor, torch.Tensor]
_PAD = 8  # extra coordinates: 2 carry the sink score; fused kernels want head dims % 8 == 0


def ttt_attention(q: torch.Tensor, block0: KV, diagonal: list[KV]) -> torch.Tensor:
    """softmax attention of step j = len(diagonal) of training-time test.

    Args:
        q: (B, nh, T, hd) queries of the new step.
        block0: (keys, values) of step 0, (B, nkv, T, hd) each; query i sees keys 0..i.
        diagonal: (keys, values) of steps 1..j (the last one the new step's own), (B, nkv, T, hd)
            each; query i sees only key i of each.

    Returns:
        (B, nh, T, hd), equal to SDPA with `eagle3.ttt_masks` for every real (right-padded) query.
    """
    k0, v0 = block0
    b, nh, t, hd = q.shape
    group = nh // k0.shape[1]
    scale = 1.0 / math.sqrt(hd)
    if not diagonal:
        return F.scaled_dot_product_attention(q, _heads(k0, group), _heads(v0, group),
                                              is_causal=True)
    dk = torch.stack([_heads(k, group) for k, _ in diagonal], dim=-2)  # (B, nh, T, j, hd)
    dv = torch.stack([_heads(v, group) for _, v in diagonal], dim=-2)
    wide = torch.promote_types(q.dtype, torch.float32)  # at least float32 for the softmax
    # per-position dot products as batched (1, hd) @ (hd, j) products: no (B, nh, T, j, hd)
    # elementwise product is formed
    scores = torch.matmul(q.unsqueeze(-2), dk.transpose(-1, -2)).squeeze(-2).to(wide) * scale
    sink = torch.logsumexp(scores, dim=-1)  # (B, nh, T): the sink key's score for each query
    high = sink.to(q.dtype)
    low = (sink - high.to(wide)).to(q.dtype)
    # queries [dummy, q_0..q_{T-1}] over keys [sink, k_0..k_{T-1}]: with is_causal, query i+1 sees
    # the sink and keys 0..i (the dummy row, which sees the sink alone, is dropped)
    extra_q = q.new_zeros(b, nh, t, _PAD)
    extra_q[..., 0] = high / scale
    extra_q[..., 1] = low / scale
    q_aug = F.pad(torch.cat([q, extra_q], dim=-1), (0, 0, 1, 0))
    k_aug = F.pad(_heads(k0, group), (0, _PAD, 1, 0))
    k_aug[:, :, 0, hd:hd + 2] = 1.0
    v_aug = F.pad(_heads(v0, group), (0, _PAD, 1, 0))
    v_aug[:, :, 0, hd] = 1.0
    out = F.scaled_dot_product_attention(q_aug, k_aug, v_aug, is_causal=True, scale=scale)
    out = out[:, :, 1:]
    share = out[..., hd:hd + 1].to(wide)  # (B, nh, T, 1): the diagonals' part of each softmax
    weights = torch.softmax(scores, dim=-1).to(q.dtype).unsqueeze(-2)  # (B, nh, T, 1, j)
    diagonal_part = share * torch.matmul(weights, dv).squeeze(-2).to(wide)
    return (out[..., :hd].to(wide) + diagonal_part).to(q.dtype)

def _heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """KV heads repeated to the query heads (GQA), (B, nkv, T, hd) -> (B, nkv * group, T, hd):
    the fused kernels take equal head counts on every backend."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)
