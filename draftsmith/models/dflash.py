"""DFlash: a block drafter. Fused features of k target layers (`hidden_norm(fc(cat(...)))`) become
the keys and values of N Qwen3-style layers (models/block_layers.py) whose queries are one block
`[anchor, MASK x (B-1)]`; one forward proposes the B-1 tokens after the anchor ("same-position"
labels: block row k predicts the token at anchor + k). The block's embeddings and the output head
are the target's, frozen.

Training draws anchors per sequence, runs every block at once under the block mask (each block
sees the context before its anchor and its own rows) and learns the target's distribution at every
row, weighted by position (decay or D-PACE). See ../shared/REFERENCE.md section 7.1; weight names
are the native checkpoint's (`fc`, `hidden_norm`, `layers.*`, `norm`).

A draft vocabulary (`draft_vocab_size`, speculators' `--draft-vocab-size`) keeps the target's head
rows of the Vd most frequent trained tokens (`d2t` / `t2d` as EAGLE-3's): every block row's output
product shrinks by V/Vd, in training and in decoding, and the drafter proposes only those tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from draftsmith.draft_vocab.drafter import DraftVocabMixin
from draftsmith.errors import DraftsmithError
from draftsmith.models.block_layers import KV, BlockDecoderLayer, ContextCache
from draftsmith.models.layers import Rotary, drafter_layer_config

LOSSES = ("kl", "ce")
POSITION_WEIGHTS = ("decay", "dpace", "uniform")


def dflash_layer_ids(num_layers: int, count: int) -> list[int]:
    """0-based target layer outputs a block drafter fuses by default.

    The reference rule (`build_target_layer_ids`): [N//2] for one layer, otherwise
    round(1 + i*(N-4)/(count-1)), e.g. [1, 8, 14, 20, 27] for N=30 and 5 layers. Where that rule
    repeats a layer or reaches the last one (whose stored output is after the final norm, so no
    engine captures it as a layer output) -- shallow targets -- the layers are spread evenly over
    0..N-2 instead, deduplicated.

    Raises:
        DraftsmithError: a target with fewer than 2 layers.
    """
    if num_layers < 2:
        raise DraftsmithError(f"a block drafter fuses target layers before the last one, but the "
                              f"target has num_hidden_layers={num_layers}; use a deeper target")
    if count == 1:
        return [num_layers // 2]
    ids = [round(1 + i * (num_layers - 4) / (count - 1)) for i in range(count)]
    if ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= num_layers - 1:
        top = num_layers - 2
        ids = sorted({round(i * top / (count - 1)) for i in range(count)})
    return ids


def check_block_layer_ids(ids: list[int], num_layers: int) -> None:
    """Fused layer ids must be strictly increasing layer outputs before the last layer.

    Raises:
        DraftsmithError: naming `drafter.target_layer_ids`, the ids and the valid range.
    """
    if not ids or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] > num_layers - 2:
        raise DraftsmithError(
            f"drafter.target_layer_ids {list(ids)} must be strictly increasing 0-based layer "
            f"outputs in 0..{num_layers - 2} (the target has num_hidden_layers={num_layers}; the "
            "last layer's output is stored after the final norm and no engine captures it); "
            "leave it unset for the default")


def default_gamma(block_size: int) -> float:
    """Position-decay gamma by block size: 7 for B=16, 5 for B=10, 4 for B=8 (DFlash paper Eq. 4
    as Model Optimizer cites it), B/2 in between and below, 7 above."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, 7.0 if block_size > 16 else block_size / 2)


@dataclass
class DFlashConfig:
    """DFlash settings.

    Attributes:
        block_size: B, tokens per block: the anchor and B-1 proposals (reference 16).
        num_layers: draft decoder layers (reference 5).
        target_layer_ids: 0-based target layer outputs to fuse; None = `dflash_layer_ids(N,
            num_layers)`.
        mask_token_id: the token whose (frozen) embedding fills the block after the anchor; None =
            the target config's `mask_token_id`, else its eos, else its pad token (pad rows are
            often zero embeddings, which would starve the first layer's queries). Pick a token the
            data never holds where the tokenizer has one (recipes name it).
        anchors_per_sequence: blocks drawn per training sequence (reference 512; capped by the
            valid positions).
        loss: `kl` (the target's distribution, soft cross-entropy) or `ce` (the target's argmax).
        position_weights: `decay` (exp(-(k-1)/gamma) for proposal k), `dpace` (D-PACE: expected
            continuation of acceptance, detached) or `uniform`.
        decay_gamma: gamma of `decay`; None = `default_gamma(block_size)`.
        draft_vocab_size: Vd, the tokens the drafter proposes (the data's most frequent trained
            ones, `data.draft_vocab_size`); None = the target's whole vocabulary.
    """

    block_size: int = 16
    num_layers: int = 5
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    anchors_per_sequence: int = 512
    loss: str = "kl"
    position_weights: str = "decay"
    decay_gamma: float | None = None
    draft_vocab_size: int | None = None

    def __post_init__(self):
        if self.block_size < 2:
            raise ValueError(f"block_size={self.block_size} must be >= 2 (the anchor and at "
                             "least one proposal)")
        for name in ("num_layers", "anchors_per_sequence"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r}; choose one of: {', '.join(LOSSES)}")
        if self.position_weights not in POSITION_WEIGHTS:
            raise ValueError(f"position_weights={self.position_weights!r}; choose one of: "
                             f"{', '.join(POSITION_WEIGHTS)}")
        if self.decay_gamma is not None and self.decay_gamma <= 0:
            raise ValueError(f"decay_gamma={self.decay_gamma} must be > 0")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must be >= 1 (leave it "
                             "unset to draft over the target's whole vocabulary)")


def resolve_mask_token(target_config, chosen: int | None) -> int:
    """The mask token id: `chosen`, else the target config's mask, eos or pad token.

    Raises:
        DraftsmithError: an id outside the vocabulary, or none to fall back on.
    """
    vocab = target_config.vocab_size
    candidates = [chosen] if chosen is not None else [
        getattr(target_config, name, None)
        for name in ("mask_token_id", "eos_token_id", "pad_token_id")]
    for value in candidates:
        value = value[0] if isinstance(value, list | tuple) and value else value
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < vocab:
                raise DraftsmithError(f"drafter.mask_token_id {value} is outside the target's "
                                      f"vocabulary 0..{vocab - 1}")
            return value
    raise DraftsmithError("the target config names no mask, eos or pad token: set "
                          "drafter.mask_token_id to a token the data never holds")


class DFlashDrafter(DraftVocabMixin, nn.Module):
    """DFlash drafter for a given target config.

    Frozen copies of the target: `embed_tokens`, `lm_head` (with a draft vocabulary: the target's
    head rows of its tokens). Trained: `fc`, `hidden_norm`, `layers`, `norm`. Buffers, with a draft
    vocabulary only: `d2t` (int64 [Vd], draft id d is target id d + d2t[d]) and `t2d` (bool [V]).
    `label_shift` is 0: block row k (k >= 1) predicts the token at anchor + k, so a block proposes
    B-1 tokens (DSpark shifts it by one).
    """

    label_shift = 0

    def __init__(self, target_config, config: DFlashConfig):
        super().__init__()
        num_layers = target_config.num_hidden_layers
        ids = list(config.target_layer_ids or dflash_layer_ids(num_layers, config.num_layers))
        check_block_layer_ids(ids, num_layers)
        self.config = replace(config, target_layer_ids=ids,
                              mask_token_id=resolve_mask_token(target_config, config.mask_token_id))
        layer_config = drafter_layer_config(target_config)
        hidden, vocab = layer_config.hidden_size, target_config.vocab_size
        self.layer_config = layer_config
        self.target_layer_ids = ids
        self.block_size = config.block_size
        self.mask_token_id = self.config.mask_token_id
        self.embed_tokens = nn.Embedding(vocab, hidden).requires_grad_(False)
        self.fc = nn.Linear(len(ids) * hidden, hidden, bias=False)
        self.hidden_norm = LlamaRMSNorm(hidden, layer_config.rms_norm_eps)
        self.layers = nn.ModuleList(BlockDecoderLayer(layer_config)
                                    for _ in range(config.num_layers))
        self.norm = LlamaRMSNorm(hidden, layer_config.rms_norm_eps)
        vd = min(config.draft_vocab_size or vocab, vocab)
        self.lm_head = nn.Linear(hidden, vd, bias=False).requires_grad_(False)
        self.rotary = Rotary(layer_config)
        if vd < vocab:
            self.add_draft_vocab(vd, vocab)

    @property
    def draft_vocab_size(self) -> int:
        """Vd: the tokens the head covers (the target's vocabulary size without a draft vocab)."""
        return self.lm_head.out_features

    @property
    def proposals(self) -> int:
        """Tokens one block proposes: B-1 (DFlash) or B (DSpark)."""
        return self.block_size - 1 + self.label_shift

    def init_from_target(self, target: nn.Module) -> None:
        """Copy the frozen embedding and output head."""
        self.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight.data)
        head = target.get_output_embeddings().weight.data
        ids = self.draft_ids()
        self.lm_head.weight.data.copy_(head if ids is None else head[ids.to(head.device)])

    @torch.no_grad()
    def init_from_data(self, features, sum_over_processes=None) -> None:
        """Start from the data's statistics: `fc` as a per-dimension rescaling of each fused layer
        (each dimension divided by its median magnitude, the layers averaged) with the massive
        dimensions dropped, and every layer's output projections at zero (each layer starts as
        the identity). Called once before training; a resumed run loads its checkpoint over it.

        Why: many targets' layer outputs carry a few massive dimensions at every position
        (SmolLM2 layer 27: |h| up to ~2.5e4 in one dimension against an RMS of ~130), so a random
        `fc` fuses nearly the same vector everywhere (mean pairwise cosine 0.77) and training sits
        on the unigram plateau. A dimension is massive where its RMS over the batch exceeds 20x the
        layer's median RMS per dimension. The first position of each sequence (special in most
        targets; of each document of packed rows) is left out.

        Args:
            features: one training batch's `Features` (its `aux_hidden` are the fused layers).
            sum_over_processes: (tensor) -> its sum over data-parallel processes, so every rank
                starts from the same weights (a dimension is ordinary where every process with
                rows says so; the scale is the mean over those processes); None on one process.
                Every process calls it once per layer, rows or not: a collective one rank
                skipped would leave the others waiting.
        """
        valid = features.attention_mask.bool().clone()
        valid[:, 0] = False
        if features.position_ids is not None:  # packed rows: every document's first position
            valid &= features.position_ids > 0
        blocks = []
        for hidden in features.aux_hidden:
            rows = hidden[valid].float()
            has = torch.ones(1, device=rows.device) if rows.shape[0] else \
                torch.zeros(1, device=rows.device)
            rms = rows.pow(2).mean(0).sqrt() if rows.shape[0] else \
                torch.zeros(rows.shape[-1], device=rows.device)
            ordinary = (rms < 20 * rms.median()).float() * has
            scale = rows.abs().median(0).values if rows.shape[0] else torch.zeros_like(rms)
            stats = torch.cat([ordinary, scale, has])
            if sum_over_processes is not None:
                stats = sum_over_processes(stats)
            size = rms.shape[0]
            ordinary, scale, count = stats[:size], stats[size:2 * size], stats[-1]
            if not count:
                return  # no process had rows to measure: keep the random start (on every rank)
            blocks.append(torch.diag((ordinary == count).float() / (scale / count + 1e-3)))
        weight = torch.cat(blocks, dim=1) / len(blocks)
        self.fc.weight.copy_(weight.to(self.fc.weight.dtype))
        for layer in self.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()

    def fuse(self, aux_hidden: list[torch.Tensor]) -> torch.Tensor:
        """hidden_norm(fc(cat(layer outputs))): the context features. (..., H)"""
        return self.hidden_norm(self.fc(torch.cat(aux_hidden, dim=-1).to(self.fc.weight.dtype)))

    def target_feature(self, last_hidden: torch.Tensor, hidden_states, index) -> torch.Tensor:
        """Fused context features of target positions `index` from a forward's hidden states."""
        return self.fuse([hidden_states[layer + 1][index] for layer in self.target_layer_ids])

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """Every layer's keys and values of fused features (m, H) at `positions` (m,)."""
        cos, sin = self.rotary(context[None], positions[None])
        return [layer.context_kv(context[None], cos, sin) for layer in self.layers]

    def block_tokens(self, anchors: torch.Tensor) -> torch.Tensor:
        """[anchor, MASK x (B-1)] per anchor: (...,) -> (..., B)."""
        tokens = anchors[..., None].repeat_interleave(self.block_size, dim=-1)
        tokens[..., 1:] = self.mask_token_id
        return tokens

    def draft_block(self, anchor: torch.Tensor, context: ContextCache) -> torch.Tensor:
        """One block at decode time: the anchor token (a 0-d tensor) at position `context.length`,
        after the cached context keys and values -> the proposals' hidden states (proposals, H)."""
        device = self.fc.weight.device
        h = self.embed_tokens(self.block_tokens(anchor.reshape(1)))  # (1, B, H)
        h = h.to(self.fc.weight.dtype)
        start = context.length
        positions = torch.arange(start, start + self.block_size, device=device)[None]
        cos, sin = self.rotary(h, positions)
        for layer, kv in zip(self.layers, context.layers, strict=True):
            h = layer.decode_block(h, cos, sin, kv, start)
        return self.norm(h[0, 1 - self.label_shift:])

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Proposal logits over the draft vocabulary (..., Vd) (the target's without one)."""
        return self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Proposal logits over the target vocabulary from `draft_block`'s hidden states (-inf
        outside a draft vocabulary)."""
        logits = self.draft_logits(hidden)
        if not self.reduced_vocab:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.t2d.shape[0]), float("-inf"))
        full[..., self.draft_ids()] = logits
        return full

    def train_hidden(self, features, anchors: torch.Tensor,
                     reach: tuple[int, ...] | None = None,
                     starts: torch.Tensor | None = None) -> torch.Tensor:
        """Every block's normed hidden states at training time: anchors (Bt, N) sorted ->
        (Bt, N, B, H). `reach`: per block column the furthest anchor of any row, counted on the
        host (`block_loss.block_plan`); None = read from `anchors` per attention chunk.
        `starts`: packed rows' (`train/packing.py`) document start of each anchor, whose block
        sees context from there, at the positions of `features.position_ids`."""
        context = self.fuse(features.aux_hidden)  # (Bt, S, H)
        bt, s = context.shape[:2]
        device = context.device
        positions = features.position_ids
        if positions is None:
            positions = torch.arange(s, device=device).expand(bt, s)
        cos, sin = self.rotary(context, positions)
        tokens = self.block_tokens(features.input_ids.gather(1, anchors))  # (Bt, N, B)
        h = self.embed_tokens(tokens.flatten(1)).to(context.dtype)  # (Bt, N*B, H)
        block_positions = (positions.gather(1, anchors)[..., None]
                           + torch.arange(self.block_size, device=device))
        block_cos, block_sin = self.rotary(h, block_positions.flatten(1))
        for layer in self.layers:
            kv = layer.context_kv(context, cos, sin)
            h = layer.train_blocks(h, block_cos, block_sin, kv, anchors, self.block_size,
                                   recompute=torch.is_grad_enabled(), reach=reach,
                                   starts=starts)
        return self.norm(h).view(bt, anchors.shape[1], self.block_size, -1)
