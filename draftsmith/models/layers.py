"""Building blocks of the feature drafters: a Llama-style decoder layer whose attention can take a
wider input (EAGLE-3's 2H), explicit RoPE positions, boolean masks and an external KV cache.

The drafter's layer hyper-parameters come from the target's config (hidden size, heads, KV heads,
head dim, RoPE, norm eps), so the same code serves Llama, Qwen2 and other Llama-like families.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from draftsmith.errors import DraftsmithError
from draftsmith.models.losses import row_argmax
from draftsmith.models.masks import document_causal_mask
from draftsmith.models.target_support import LAYER_FIELDS, SUPPORTED, unsupported_target
from draftsmith.models.ttt_attention import ttt_attention

KV = tuple[torch.Tensor, torch.Tensor]


class TargetLogits(Protocol):
    """The target's logits as a drafter's loss reads them (the training `Features`, or
    `dense_target_logits` over precomputed logits).

    The per-position losses read `trained_positions(loss_mask)` (the (m,) flat positions whose
    next token is trained, counted by the collate on the host) and the logits after them,
    `every_at(rows)` or `restricted_every_at(columns, rows)`: each step gathers those m rows,
    and nothing waits on a host count. Calling it, `(valid, shift)` -> (m, V) rows at i + shift
    for every i set in `valid` (a boolean selection: a host read on a GPU), serves reference
    computations (tests).
    """

    def __call__(self, valid: torch.Tensor, shift: int) -> torch.Tensor: ...

    def trained_positions(self, loss_mask: torch.Tensor) -> torch.Tensor:
        """(m,) flat (B * T) positions whose next token is trained, ascending."""

    def every_at(self, rows: torch.Tensor) -> torch.Tensor:
        """(m, V): the logits after flat positions `rows`."""

    def restricted_every_at(self, columns: torch.Tensor, rows: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """((m, C) logits after flat positions `rows` over `columns`, (m,) full-vocabulary
        argmax)."""


class DenseTargetLogits:
    """A TargetLogits over precomputed (B, T, V) logits."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits

    def __call__(self, valid: torch.Tensor, shift: int) -> torch.Tensor:
        return shift_left(self.logits, shift)[valid]

    def trained_positions(self, loss_mask: torch.Tensor) -> torch.Tensor:
        return next_trained_rows(loss_mask)

    def every_at(self, rows: torch.Tensor) -> torch.Tensor:
        return self.logits.flatten(0, 1)[rows]

    def restricted_every_at(self, columns: torch.Tensor, rows: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.every_at(rows)
        return logits[:, columns], row_argmax(logits)


def dense_target_logits(logits: torch.Tensor) -> DenseTargetLogits:
    """A TargetLogits over precomputed (B, T, V) logits."""
    return DenseTargetLogits(logits)


# restricted(rows): (the target's logits over a column subset (m, C), its full-vocabulary argmax
# (m,)) after each of the flat (B * T) positions `rows` (P-EAGLE's anchors).
RestrictedTargetLogits = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def restrict_target_logits_at(target_logits_after: TargetLogits, columns: torch.Tensor
                              ) -> RestrictedTargetLogits:
    """The target's logits over `columns` and its argmax after given flat positions, from a
    TargetLogits. One that offers `.restricted_rows(columns)` (the training features) slices and
    argmaxes its trained rows once per batch and gathers them per call; otherwise each call
    computes its rows (`restricted_every_at`). The values are the same."""
    restricted = getattr(target_logits_after, "restricted_rows", None)
    if restricted is not None:
        return restricted(columns)
    return lambda rows: target_logits_after.restricted_every_at(columns, rows)


def drafter_layer_config(target_config, **overrides) -> LlamaConfig:
    """A one-layer Llama config mirroring the target's shapes, RoPE and norm eps.

    Raises:
        DraftsmithError: a target config without those shapes (GPT-2 has no intermediate_size).
    """
    why = unsupported_target(target_config, LAYER_FIELDS)
    if why is not None:
        raise DraftsmithError(f"draftsmith's drafter layers mirror the target's: {why}. They "
                              f"support {SUPPORTED}; use such a target")
    head_dim = getattr(target_config, "head_dim", None) or (
        target_config.hidden_size // target_config.num_attention_heads)
    rope = getattr(target_config, "rope_parameters", None) or {
        "rope_type": "default", "rope_theta": getattr(target_config, "rope_theta", 10000.0)}
    kwargs = dict(
        vocab_size=target_config.vocab_size,
        hidden_size=target_config.hidden_size,
        intermediate_size=target_config.intermediate_size,
        num_attention_heads=target_config.num_attention_heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", None)
        or target_config.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
        rope_parameters=dict(rope),
        max_position_embeddings=getattr(target_config, "max_position_embeddings", 4096),
        hidden_act=getattr(target_config, "hidden_act", "silu"),
        num_hidden_layers=1,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


class DraftAttention(nn.Module):
    """Multi-head attention with GQA and RoPE whose projections take `input_size` features."""

    def __init__(self, config: LlamaConfig, input_size: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(input_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[
            torch.Tensor, KV]:
        """Queries and (keys, values) for x. (B, T, in) -> (B, nh, T, hd), ((B, nkv, T, hd) x 2)"""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, (k, v)

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(q k^T) v per head, (B, nh, T, hd), with a bool mask (True = visible)
        broadcastable to (B, nh, T, S); no output projection."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True,
                                              is_causal=False)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """`attend_heads` then the output projection. (B, T, H)"""
        out = self.attend_heads(q, k, v, mask)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class DraftDecoderLayer(nn.Module):
    """`h = residual + attn(attn_input)`, then `h + mlp(post_attention_layernorm(h))`.

    The caller builds `attn_input` and `residual`: EAGLE-1 passes the fused input for both (no
    input norm), EAGLE-3 passes `cat(input_layernorm(embed), hidden_norm(h))` and `h`, MTP passes
    `input_layernorm(x)` and `x`. Norm modules that a variant needs are created by the variant.
    """

    def __init__(self, config: LlamaConfig, attn_input_size: int):
        super().__init__()
        self.self_attn = DraftAttention(config, attn_input_size)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        # recompute this layer's activations in backward instead of keeping them
        # (train.gradient_checkpointing; see `set_gradient_checkpointing`)
        self.gradient_checkpointing = False

    def forward(self, attn_input: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, mask: torch.Tensor | None, past: KV | None = None,
                extra_kv: list[KV] | None = None) -> tuple[torch.Tensor, KV]:
        """Args:
            attn_input: (B, T, in) input to q/k/v.
            residual: (B, T, H).
            cos, sin: RoPE tables for the T new positions.
            mask: bool, broadcastable to (B, 1, T, S) over [past, extra_kv..., new] keys.
            past: cached (keys, values) before the new ones, or None.
            extra_kv: more (keys, values) blocks placed between past and new (training-time test).

        Returns:
            (output (B, T, H), (keys, values) of the new positions only).
        """
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward, attn_input, residual, cos, sin, mask, past,
                              extra_kv, use_reentrant=False)
        return self._forward(attn_input, residual, cos, sin, mask, past, extra_kv)

    def _forward(self, attn_input, residual, cos, sin, mask, past, extra_kv):
        q, (k, v) = self.self_attn.project_kv(attn_input, cos, sin)
        keys, values = [k], [v]
        for ek, ev in reversed(extra_kv or []):
            keys.insert(0, ek)
            values.insert(0, ev)
        if past is not None:
            keys.insert(0, past[0])
            values.insert(0, past[1])
        all_k = torch.cat(keys, dim=2) if len(keys) > 1 else k
        all_v = torch.cat(values, dim=2) if len(values) > 1 else v
        h = residual + self.self_attn.attend(q, all_k, all_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h)), (k, v)

    def forward_rows(self, attn_input: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, rows: torch.Tensor, shape: tuple[int, int],
                     extra_kv: list[KV], documents: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, KV]:
        """One training-time-test step on packed rows: every row-wise part (projections, norms,
        MLP) runs on those rows alone and only attention in the padded layout, through
        `ttt_attention` (causal over block 0, the same position in later blocks; no mask).

        Args:
            attn_input: (m, in) and residual: (m, H): the rows at flat positions `rows` (m,) of
                a right-padded (B, T) = `shape` layout.
            cos, sin: RoPE tables of those rows, (1, m, hd).
            extra_kv: earlier steps' (keys, values) in the padded layout, (B, nkv, T, hd) each:
                block 0 first (empty at step 0, whose own keys are block 0). A position not in
                `rows` has zero keys and values and its output is not computed; every row of a
                later step must be a row of each earlier one (its diagonal keys).
            documents: (B, T) document ids of packed rows (`train/packing.py`), or None.

        Returns:
            (output (m, H), (keys, values) of the new rows in the padded layout (B, nkv, T, hd)).
        """
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward_rows, attn_input, residual, cos, sin, rows, shape,
                              extra_kv, documents, use_reentrant=False)
        return self._forward_rows(attn_input, residual, cos, sin, rows, shape, extra_kv, documents)

    def _forward_rows(self, attn_input, residual, cos, sin, rows, shape, extra_kv,
                      documents=None):
        attn = self.self_attn
        q, (k, v) = attn.project_kv(attn_input[None], cos, sin)
        q, k, v = (scatter_rows(x[0].transpose(0, 1), rows, shape) for x in (q, k, v))
        blocks = [*extra_kv, (k, v)]
        heads = ttt_attention(q, blocks[0], blocks[1:], documents).transpose(1, 2)  # (B,T,nh,hd)
        # plain indexing: its backward (index_put) is several times faster than
        # index_select's (scatter_add) on CPU
        heads = heads.reshape(-1, attn.num_heads * attn.head_dim)[rows]
        h = residual + attn.o_proj(heads)
        return h + self.mlp(self.post_attention_layernorm(h)), (k, v)


def set_gradient_checkpointing(module: nn.Module, enabled: bool) -> int:
    """Turn activation recomputation on or off in every `DraftDecoderLayer` under `module`;
    returns how many layers it applies to (0: the drafter has none, e.g. Medusa)."""
    layers = [m for m in module.modules() if isinstance(m, DraftDecoderLayer)]
    for layer in layers:
        layer.gradient_checkpointing = enabled
    return len(layers)


def batch_generator(seed: int, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    loss_mask: torch.Tensor) -> torch.Generator:
    """A CPU generator for a batch's random draws in the collate (P-EAGLE's COD slots, the block
    drafters' anchors), seeded by the batch's tokens and `seed` (`train.seed`): the same batch
    draws the same, so a resumed run draws what the first did."""
    content = int((input_ids * loss_mask).sum()) * 1_000_003 + int(attention_mask.sum())
    return torch.Generator().manual_seed((seed * 7_919 + content) % 2 ** 62)


def compile_layers(module: nn.Module) -> int:
    """`torch.compile` the step of every `DraftDecoderLayer` under `module` (its padded and
    packed-row forwards, with dynamic shapes: batches and packed rows change size); returns how
    many layers (0: the drafter has none). Parameters and their names are unchanged."""
    layers = [m for m in module.modules() if isinstance(m, DraftDecoderLayer)]
    for layer in layers:
        for name in ("_forward", "_forward_rows"):
            setattr(layer, name, torch.compile(getattr(layer, name), dynamic=True))
    return len(layers)


def scatter_rows(x: torch.Tensor, rows: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Per-head rows (m, n, hd) at flat positions `rows` of a (B, T) layout -> (B, n, T, hd),
    zero elsewhere."""
    b, t = shape
    full = x.new_zeros(b * t, *x.shape[1:]).index_copy(0, rows, x)
    return full.view(b, t, *x.shape[1:]).transpose(1, 2)


class Rotary(nn.Module):
    """RoPE tables for explicit position ids, from the drafter's config (non-persistent)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, like: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor,
                                                                                torch.Tensor]:
        return self.rotary(like, position_ids)


def causal_mask(t: int, device: torch.device) -> torch.Tensor:
    """(1, 1, t, t) bool lower-triangular mask."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()[None, None]


def padded_causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) causal mask that also hides padded keys; padded queries see themselves."""
    t = attention_mask.shape[1]
    mask = causal_mask(t, attention_mask.device) & attention_mask[:, None, None, :].bool()
    return mask | torch.eye(t, dtype=torch.bool, device=attention_mask.device)[None, None]


def self_attention_mask(attention_mask: torch.Tensor, documents: torch.Tensor | None = None
                        ) -> torch.Tensor:
    """A training batch's (B, 1, T, T) causal mask: `padded_causal_mask`, or each document's
    (`masks.document_causal_mask`) for packed rows (`train/packing.py`)."""
    return padded_causal_mask(attention_mask) if documents is None else \
        document_causal_mask(documents)


def sequence_positions(input_ids: torch.Tensor, position_ids: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """(B, T) each token's position in its own sequence: 0..T-1 in every row, or a packed
    batch's `position_ids`."""
    if position_ids is not None:
        return position_ids
    b, t = input_ids.shape
    return torch.arange(t, device=input_ids.device)[None].expand(b, t)


def offset_in_sequence(flat: torch.Tensor, t: int, position_ids: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """Each flat (B * T) position's offset in its own sequence (its row, or its packed
    document): a loss's row `p - k` lies in p's sequence where this is at least k."""
    return flat % t if position_ids is None else position_ids.flatten()[flat]


def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """x[:, n:] padded with `fill` at the end (dim 1)."""
    if n == 0:
        return x
    pad = x.new_full((x.shape[0], n, *x.shape[2:]), fill)
    return torch.cat([x[:, n:], pad], dim=1)



def next_trained_rows(loss_mask: torch.Tensor) -> torch.Tensor:
    """(m,) flat (B * T) positions whose next token is trained, ascending: the positions after
    which every per-position loss reads the target's logits. The collate computes them on the
    host, where counting makes no device wait (train/batching.py); on a GPU tensor this is one
    host read.

    Args:
        loss_mask: (B, T), 1 on trained tokens.
    """
    return (shift_left(loss_mask, 1) > 0).flatten().nonzero().squeeze(1)
