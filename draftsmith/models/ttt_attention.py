"""Training-time-test attention without a dense mask: EAGLE-3 step j attends causally over block 0
(the real sequence's keys) and to the same position's keys in blocks 1..j.

Written as one masked SDPA (`ttt_rows.ttt_masks`), no fused kernel accepts it and the math backend
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
causal attention over block 0 equals the padding-aware mask for every real query. Packed rows
(`train/packing.py`) pass their `documents`: block 0 is then causal within each document (an
explicit mask, the sink key visible to all).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from draftsmith.models.masks import document_causal_mask

KV = tuple[torch.Tensor, torch.Tensor]
_PAD = 8  # extra coordinates: 2 carry the sink score; fused kernels want head dims % 8 == 0


def ttt_attention(q: torch.Tensor, block0: KV, diagonal: list[KV],
                  documents: torch.Tensor | None = None) -> torch.Tensor:
    """softmax attention of step j = len(diagonal) of training-time test.

    Args:
        q: (B, nh, T, hd) queries of the new step.
        block0: (keys, values) of step 0, (B, nkv, T, hd) each; query i sees keys 0..i.
        diagonal: (keys, values) of steps 1..j (the last one the new step's own), (B, nkv, T, hd)
            each; query i sees only key i of each.
        documents: (B, T) document index of each token of packed rows (0 on padding), or None
            (one sequence per row).

    Returns:
        (B, nh, T, hd), equal to SDPA with `ttt_rows.ttt_masks` for every real (right-padded) query.
        Grouped KV heads are read in place (SDPA's `enable_gqa`, grouped products for the
        diagonals): no key or value is copied to every query head.
    """
    k0, v0 = block0
    b, nh, t, hd = q.shape
    nkv = k0.shape[1]
    group = nh // nkv
    scale = 1.0 / math.sqrt(hd)
    if not diagonal:
        if documents is None:
            return F.scaled_dot_product_attention(q, k0, v0, is_causal=True, enable_gqa=group > 1)
        return F.scaled_dot_product_attention(q, k0, v0, attn_mask=document_causal_mask(documents),
                                              enable_gqa=group > 1)
    dk = torch.stack([k for k, _ in diagonal], dim=-2)  # (B, nkv, T, j, hd)
    dv = torch.stack([v for _, v in diagonal], dim=-2)
    wide = torch.promote_types(q.dtype, torch.float32)  # at least float32 for the softmax
    # per-position dot products as batched (group, hd) @ (hd, j) products, the query heads of a
    # KV head together: no (B, nh, T, j, hd) product and no repeated keys are formed
    grouped = q.view(b, nkv, group, t, hd).transpose(2, 3)  # (B, nkv, T, group, hd)
    scores = torch.matmul(grouped, dk.transpose(-1, -2)).to(wide) * scale  # (.., group, j)
    # the sink key's score for each query, divided by the scale in `wide` before the split into
    # a high and a low part of q's dtype, whose sum SDPA multiplies back by the scale
    sink = (torch.logsumexp(scores, dim=-1) / scale).transpose(2, 3).reshape(b, nh, t)
    high = sink.to(q.dtype)
    low = (sink - high.to(wide)).to(q.dtype)
    # queries [dummy, q_0..q_{T-1}] over keys [sink, k_0..k_{T-1}]: with is_causal, query i+1 sees
    # the sink and keys 0..i (the dummy row, which sees the sink alone, is dropped)
    extra_q = q.new_zeros(b, nh, t, _PAD)
    extra_q[..., 0] = high
    extra_q[..., 1] = low
    q_aug = F.pad(torch.cat([q, extra_q], dim=-1), (0, 0, 1, 0))
    k_aug = F.pad(k0, (0, _PAD, 1, 0))
    k_aug[:, :, 0, hd:hd + 2] = 1.0
    v_aug = F.pad(v0, (0, _PAD, 1, 0))
    v_aug[:, :, 0, hd] = 1.0
    if documents is None:
        out = F.scaled_dot_product_attention(q_aug, k_aug, v_aug, is_causal=True, scale=scale,
                                             enable_gqa=group > 1)
    else:  # the dummy query and the sink key in front of each document's causal mask
        mask = F.pad(document_causal_mask(documents), (1, 0, 1, 0))
        mask[..., 0] = True
        out = F.scaled_dot_product_attention(q_aug, k_aug, v_aug, attn_mask=mask, scale=scale,
                                             enable_gqa=group > 1)
    out = out[:, :, 1:]
    share = out[..., hd:hd + 1].to(wide)  # (B, nh, T, 1): the diagonals' part of each softmax
    weights = torch.softmax(scores, dim=-1).to(q.dtype)  # (B, nkv, T, group, j)
    diagonal_part = torch.matmul(weights, dv).transpose(2, 3).reshape(b, nh, t, hd)
    return (out[..., :hd].to(wide) + share * diagonal_part.to(wide)).to(q.dtype)
