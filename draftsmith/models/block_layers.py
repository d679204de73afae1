"""The decoder layer of block drafters (DFlash, DSpark): Qwen3-style (pre-norm, per-head q/k
RMSNorm, SwiGLU MLP), whose queries are the block's tokens and whose keys and values are the
target context's fused features followed by the block's own, through the same k/v projections.

The context is not a prefix of the layer's input: its keys and values come from the fused target
features (`hidden_norm(fc(...))`, the same tensor for every layer) and are never updated by a
layer, so a decoder keeps them as a per-layer cache and a block only adds its B rows. Attention is
bidirectional inside a block and sees context positions before the block's anchor.

Weight names follow the native DFlash checkpoint (`self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`,
`mlp.{gate,up,down}_proj`, `input_layernorm`, `post_attention_layernorm`); see
../shared/REFERENCE.md section 7.1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, rotate_half

KV = tuple[torch.Tensor, torch.Tensor]

# score elements (query rows x keys x heads) one training attention chunk may hold; bounds the
# training attention's memory whatever the sequence length and anchor count
CHUNK_SCORES = 1 << 24


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, heads, T, hd) with tables (B, T, hd)."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


class BlockAttention(nn.Module):
    """Attention of block queries over [context keys, block keys] with GQA and q/k norms."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        self.q_norm = LlamaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(self.head_dim, config.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """Normed, rotated keys and values of x (B, T, H): ((B, nkv, T, hd) x 2)."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        return rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Normed, rotated queries of x (B, T, H): (B, nh, T, hd)."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim))
        return rope(q.transpose(1, 2), cos, sin)

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """(B, nh, T, hd) -> (B, T, H) through o_proj."""
        b, _, t, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class ContextCache:
    """Every layer's keys and values of the verified context, for decoding: buffers with room for
    one block after the context, grown by doubling. Appending m positions copies m rows (not the
    whole context) and a block writes its own keys after the context in place, so a decoding step
    costs the same at any context length.

    Args:
        block_size: rows a block writes after the context.
    """

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.layers: list[KV] = []
        self.length = 0

    def append(self, new: list[KV]) -> None:
        """Add each layer's keys and values of m new positions ((1, nkv, m, hd) each)."""
        m = new[0][0].shape[2]
        need = self.length + m + self.block_size
        if not self.layers or need > self.layers[0][0].shape[2]:
            capacity = max(need, 2 * self.layers[0][0].shape[2] if self.layers else 64)
            grown = []
            for index, (k, v) in enumerate(new):
                buffers = tuple(x.new_empty(*x.shape[:2], capacity, x.shape[3]) for x in (k, v))
                if self.layers:
                    for old, buffer in zip(self.layers[index], buffers, strict=True):
                        buffer[:, :, :self.length] = old[:, :, :self.length]
                grown.append(buffers)
            self.layers = grown
        for (k, v), (nk, nv) in zip(self.layers, new, strict=True):
            k[:, :, self.length:self.length + m] = nk
            v[:, :, self.length:self.length + m] = nv
        self.length += m


class BlockDecoderLayer(nn.Module):
    """`h + attn(input_layernorm(h))`, then `h + mlp(post_attention_layernorm(h))`."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = BlockAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def context_kv(self, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """This layer's keys and values of fused context features (B, S, H) at their positions."""
        return self.self_attn.keys_values(context, cos, sin)

    def decode_block(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     context: KV, length: int) -> torch.Tensor:
        """One block at decode time: h (1, B, H) attends the first `length` context keys of this
        layer's cache buffers (1, nkv, >= length + B, hd) and every block key, which it writes
        after them (the next append overwrites them). Returns (1, B, H)."""
        x = self.input_layernorm(h)
        attn = self.self_attn
        q = attn.queries(x, cos, sin)
        k, v = attn.keys_values(x, cos, sin)
        end = length + k.shape[2]
        context[0][:, :, length:end] = k
        context[1][:, :, length:end] = v
        attended = F.scaled_dot_product_attention(q, context[0][:, :, :end],
                                                  context[1][:, :, :end], enable_gqa=True)
        h = h + attn.output(attended)
        return h + self.mlp(self.post_attention_layernorm(h))

    def train_blocks(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: KV,
                     anchors: torch.Tensor, block_size: int, recompute: bool,
                     reach: tuple[int, ...] | None = None,
                     starts: torch.Tensor | None = None) -> torch.Tensor:
        """Many blocks per sequence at training time.

        Block j of sequence b (its B rows at h[b, j*B:(j+1)*B]) sees the context keys at
        positions < anchors[b, j] and all B keys of its own block, never another block's. The
        blocks are attended in chunks whose scores hold at most `CHUNK_SCORES` elements, each over
        the context prefix its last anchor needs; with `recompute` each chunk's attention is
        recomputed in the backward pass instead of kept, so memory does not grow with
        (blocks x context).

        Args:
            h: (Bt, N*B, H) block hidden states.
            cos, sin: (Bt, N*B, hd) RoPE tables of the block positions.
            context: this layer's context keys and values, (Bt, nkv, S, hd) each.
            anchors: (Bt, N) sorted anchor positions (padding anchors may repeat any position).
            block_size: B.
            recompute: checkpoint each chunk (training with gradients).
            reach: per block column the furthest anchor of any row, counted on the host; None =
                each chunk reads its furthest anchor from `anchors` (a host read on a GPU).
            starts: (Bt, N) where each anchor's document starts in packed rows
                (`train/packing.py`): its block sees the context keys from there; None = 0.
        """
        x = self.input_layernorm(h)
        attn = self.self_attn
        q = attn.queries(x, cos, sin)
        k, v = attn.keys_values(x, cos, sin)
        n_blocks, batch = anchors.shape[1], h.shape[0]
        per_block = block_size * (context[0].shape[2] + block_size) * attn.num_heads * batch
        chunk = max(1, min(n_blocks, CHUNK_SCORES // max(per_block, 1)))
        outputs = []
        for first in range(0, n_blocks, chunk):
            rows = slice(first * block_size, min(first + chunk, n_blocks) * block_size)
            last = min(first + chunk, n_blocks)
            cut = int(anchors[:, first:last].max()) if reach is None else reach[last - 1]
            args = (q[:, :, rows], k[:, :, rows], v[:, :, rows], context[0][:, :, :cut],
                    context[1][:, :, :cut], anchors[:, first:last],
                    None if starts is None else starts[:, first:last])
            if recompute:
                outputs.append(checkpoint(self._attend_chunk, *args, use_reentrant=False))
            else:
                outputs.append(self._attend_chunk(*args))
        h = h + attn.output(torch.cat(outputs, dim=2))
        return h + self.mlp(self.post_attention_layernorm(h))

    def _attend_chunk(self, q, k, v, context_k, context_v, anchors, starts=None):
        """Attention of a chunk of c blocks: q (Bt, nh, c*B, hd), the blocks' keys and values
        (Bt, nkv, c*B, hd), the context's up to the chunk's furthest anchor (Bt, nkv, reach, hd)
        (no block of the chunk sees further), anchors (Bt, c) and their documents' starts (Bt, c)
        or None. Each row's scores are [its visible context keys, its own block's B keys],
        softmaxed together in float32. Returns (Bt, nh, c*B, hd)."""
        attn = self.self_attn
        bt, nh, rows, hd = q.shape
        nkv, c = attn.num_kv_heads, anchors.shape[1]
        block = rows // c
        reach = context_k.shape[2]
        q = q.reshape(bt, nkv, nh // nkv, rows, hd) * hd ** -0.5
        scores_context = torch.einsum("bkgrd,bksd->bkgrs", q, context_k).float()
        keys = torch.arange(reach, device=q.device)[None, None, :]
        hidden = keys >= anchors.repeat_interleave(block, dim=1)[:, :, None]  # (Bt, c*B, reach)
        if starts is not None:  # packed rows: nothing before the anchor's document
            hidden = hidden | (keys < starts.repeat_interleave(block, dim=1)[:, :, None])
        scores_context = scores_context.masked_fill(hidden[:, None, None], float("-inf"))
        q_blocks = q.reshape(bt, nkv, nh // nkv, c, block, hd)
        k_blocks = k.reshape(bt, nkv, c, block, hd)
        scores_block = torch.einsum("bkgcid,bkcjd->bkgcij", q_blocks, k_blocks).float()
        scores = torch.cat([scores_context, scores_block.reshape(*scores_context.shape[:4], block)],
                           dim=-1)
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        out = torch.einsum("bkgrs,bksd->bkgrd", probs[..., :reach], context_v)
        probs_block = probs[..., reach:].reshape(bt, nkv, nh // nkv, c, block, block)
        out = out + torch.einsum("bkgcij,bkcjd->bkgcid", probs_block,
                                 v.reshape(bt, nkv, c, block, hd)).reshape(out.shape)
        return out.reshape(bt, nh, rows, hd)
