"""P-EAGLE drafter: EAGLE-3 that drafts every depth in one forward (parallel drafting).

The module is EAGLE-3's (`Eagle3Drafter`: fused low/mid/high features, the 2H-wide decoder layer,
the draft vocabulary, EAGLE-3.1's norms) plus a learnable `mask_hidden` [1, 1, 3H] that stands in
for the fused target features no one has yet at the parallel slots, whose input token is
`mask_token_id`. At decode time one causal forward runs the newly verified rows and then k-1 slots
`(mask_token_id, fc(mask_hidden))` at the positions after them: the last real row drafts depth 1,
slot d depth d+1 (vLLM's `parallel_drafting`, REFERENCE.md section 7.3).

Training samples the slots by COD (conditional drop-token) sampling: depth 0 is every real row;
depth d keeps a random subset of depth d-1's anchors, floor((n - d) * max(r^d, r_min)) of the n
trained positions of a sequence (r = 0.7, r_min = 0.2 as speculators). Element (anchor a, depth d)
sits at position a + d and attends to the real rows up to a and to its own anchor's earlier
depths: EAGLE-3's training-time-test pattern with rows indexed by anchor, so the training forward
is EAGLE-3's packed-row step (`step_rows`, `ttt_attention`) with the mask inputs instead of the
previous step's output. Each depth matches the target's distribution at a + d + 1 over the draft
vocabulary (KL by default, no position decay); losses and Muon are EAGLE-3's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from torch import nn

from draftsmith.models.dflash import resolve_mask_token
from draftsmith.models.eagle3 import Eagle3Drafter
from draftsmith.models.layers import (
    KV,
    TargetLogits,
    batch_generator,
    restrict_target_logits_at,
    shift_left,
)
from draftsmith.models.losses import (
    PositionLosses,
    check_position_weights,
    decay_weights,
    parse_loss,
    row_argmax,
)
from draftsmith.models.ttt_rows import label_valid, ttt_rows


@dataclass
class PEagleConfig:
    """P-EAGLE settings (EAGLE-3's, with the parallel slots' in place of the TTT unroll).

    Attributes:
        draft_vocab_size: Vd, tokens the drafter can propose (<= target vocab).
        num_depths: depths trained, and the most drafts one forward proposes (speculators'
            schema default 8; SpecForge's example 5).
        cod_ratio: COD sampling's r: depth d keeps a fraction max(r^d, cod_min_ratio) of the
            positions (speculators 0.7, SpecForge 0.8).
        cod_min_ratio: COD sampling's floor r_min (0.2 in both).
        mask_token_id: the parallel slots' input token; None = the target config's mask, eos or
            pad token (`resolve_mask_token`, as DFlash; SmolLM2 has no unused embedding row, its
            recipes use <empty_output>, 16). Recorded in the config once built.
        layer_ids: target layer outputs to fuse; None = `eagle3_layer_ids(N)`.
        fc_norm, norm_output: EAGLE-3.1's norms (see `Eagle3Config`).
        loss: per-depth loss against the target's distribution (see models/losses.py).
        position_weights: `geometric` (step_weight ** d), `decay` or `dpace`.
        step_weight: weight decay per depth of `geometric`; 1.0 = none, as the peers train.
        decay_gamma: gamma of `decay`.
        freeze_head: the draft head keeps the target's draft-vocabulary rows, untrained (see
            `Eagle3Config`; speculators' P-EAGLE, like its EAGLE-3, freezes `lm_head`).
    """

    draft_vocab_size: int = 32000
    num_depths: int = 8
    cod_ratio: float = 0.7
    cod_min_ratio: float = 0.2
    mask_token_id: int | None = None
    layer_ids: list[int] | None = None
    fc_norm: bool = False
    norm_output: bool = False
    loss: str | dict = "kl"
    position_weights: str = "geometric"
    step_weight: float = 1.0
    decay_gamma: float = 4.0
    freeze_head: bool = False

    def __post_init__(self):
        if self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must be >= 1")
        if self.num_depths < 1:
            raise ValueError(f"num_depths={self.num_depths} must be >= 1 (drafts per forward)")
        for name in ("cod_ratio", "cod_min_ratio"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}={getattr(self, name)} must lie in (0, 1] (speculators: "
                                 "cod_ratio 0.7, cod_min_ratio 0.2)")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise ValueError(f"mask_token_id={self.mask_token_id} must be a token id >= 0, or "
                             "unset for the target's pad / eos token")
        parse_loss(self.loss)
        check_position_weights(self.position_weights, self.decay_gamma)

    @property
    def eagle31(self) -> bool:
        """Any EAGLE-3.1 setting on."""
        return self.fc_norm or self.norm_output


class PEagleDrafter(Eagle3Drafter):
    """P-EAGLE drafter for a given target config: `Eagle3Drafter` plus `mask_hidden`.

    Trained besides EAGLE-3's parts: `mask_hidden` [1, 1, 3H], the fused-feature input of the
    parallel slots (in the target's hidden space, so it goes through `fc` as vLLM's
    `combine_hidden_states` does).
    """

    kind = "peagle"


    def warm_teacher(self, features) -> None:
        """What `peagle_loss` reads of the target's head for this batch (its trained rows over
        the draft vocabulary), computed on the target's thread (`train.overlap_target`)."""
        features.teacher_ahead = restrict_target_logits_at(features, self.draft_ids())
    def __init__(self, target_config, config: PEagleConfig):
        token = resolve_mask_token(target_config, config.mask_token_id)
        super().__init__(target_config, replace(config, mask_token_id=token))
        width = len(self.layer_ids) * self.layer_config.hidden_size
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, width) * 0.02)

    @property
    def proposals(self) -> int:
        """The most drafts one forward proposes: the depths trained."""
        return self.config.num_depths

    def mask_feature(self) -> torch.Tensor:
        """The parallel slots' drafter input, fc(mask_hidden) (fc_norm'ed per layer). (1, H)"""
        return self.fuse(list(self.mask_hidden[0].split(self.layer_config.hidden_size, -1)))

    def draft_parallel(self, tokens: torch.Tensor, features: torch.Tensor,
                       position_ids: torch.Tensor, past: KV | None, depth: int
                       ) -> tuple[torch.Tensor, KV]:
        """One decode-time forward on one sequence: n new real rows (tokens (n,), features (n, H),
        positions (n,)) after the cached `past`, then depth - 1 mask slots at the positions after
        them, all causal.

        Returns:
            (the states of the last real row and the slots (depth, H), whose heads draft depths
            1..depth; the real rows' (keys, values), the slots' are dropped).
        """
        n, slots = tokens.shape[0], depth - 1
        device = tokens.device
        offsets = torch.arange(1, slots + 1, device=device)
        tokens = torch.cat([tokens, tokens.new_full((slots,), self.config.mask_token_id)])
        hidden = torch.cat([features.to(self.fc.weight.dtype),
                            self.mask_feature().expand(slots, -1)])
        positions = torch.cat([position_ids, position_ids[-1] + offsets])
        seen = 0 if past is None else past[0].shape[2]
        rows = n + slots
        mask = torch.cat([torch.ones(rows, seen, dtype=torch.bool, device=device),
                          torch.ones(rows, rows, dtype=torch.bool, device=device).tril()], 1)
        out, (k, v) = self.step(tokens[None], hidden[None], positions[None], mask[None, None],
                                past, with_logits=False)
        return out[0, n - 1:], (k[:, :, :n], v[:, :, :n])

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits over the draft vocabulary (..., Vd), float32."""
        return self.head(hidden).float()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target vocabulary (..., V), -inf outside the draft vocabulary."""
        logits = self.draft_logits(hidden)
        full = logits.new_full((*logits.shape[:-1], self.t2d.shape[0]), float("-inf"))
        full[..., self.draft_ids()] = logits
        return full


def cod_anchors(valid: list[torch.Tensor], ratio: float, min_ratio: float,
                generator: torch.Generator | None = None,
                documents: torch.Tensor | None = None) -> list[torch.Tensor]:
    """COD sampling: the anchors each depth trains, (B, T) bool each.

    Depth 0: every trained position (`valid[0]`). Depth d: a uniform random subset of depth
    d-1's anchors whose depth-d label is trained, floor((n - d) * max(ratio^d, min_ratio)) of
    them per sequence (n: its depth-0 count; all of them when fewer are eligible). Each set
    holds the next, as the training step's packed rows require. No host sync.

    Args:
        valid: (B, T) bool per depth, where that depth's label is trained (`ttt_rows.label_valid`).
        generator: the draw's random source (the collate's, seeded by the batch).
        documents: (B, T) document ids of packed rows (`train/packing.py`): each document is a
            sequence of its own (its own count, drawn among its own anchors); None = rows.
    """
    if documents is None:  # one sequence per row
        documents = torch.zeros_like(valid[0], dtype=torch.long)
    b, t = documents.shape
    group = (torch.arange(b, device=documents.device)[:, None] * (t + 1) + documents).flatten()
    per_group = torch.zeros(b * (t + 1), dtype=torch.long, device=documents.device)
    sizes = per_group.index_add(0, group, torch.ones_like(group))
    starts = sizes.cumsum(0) - sizes
    seeds = per_group.index_add(0, group, valid[0].flatten().long())
    chosen = [valid[0]]
    for depth in range(1, len(valid)):
        eligible = chosen[-1] & valid[depth]
        fraction = max(ratio ** depth, min_ratio)
        count = ((seeds - depth).clamp_min(0).double() * fraction).floor().long()
        scores = torch.rand(eligible.shape, device=eligible.device, generator=generator)
        # by sequence, then by score, highest first: a position's rank within its sequence
        key = group.double() * 4 - scores.masked_fill(~eligible, -1.0).flatten().double()
        rank = key.argsort().argsort() - starts[group]
        chosen.append(eligible & (rank < count[group]).view(b, t))
    return chosen


def cod_rows(attention_mask: torch.Tensor, anchors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The training forward's rows of a COD draw, as flat (B * T) positions in ascending order
    (counted where the masks live: the collate runs this on the host, so the step reads none):
    `packed`, depth 0's rows (every real token and every depth-0 anchor: the keys later depths
    read); `anchors.{d}`, depth d's anchors; `scored`, where depth 0's anchors sit in `packed`.

    Args:
        attention_mask: (B, T), right-padded.
        anchors: (B, T) bool per depth, each set holding the next (`cod_anchors`).
    """
    packed = ttt_rows(attention_mask, anchors)[0].flatten().nonzero().squeeze(1)
    flat = [a.flatten().nonzero().squeeze(1) for a in anchors]
    return {"packed": packed, "scored": torch.searchsorted(packed, flat[0]),
            **{f"anchors.{d}": rows for d, rows in enumerate(flat)}}


def collate_cod_rows(config: PEagleConfig, seed: int, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                     documents: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """A batch's COD draw and its rows (`cod_rows`), made by the collate on the host. The draw
    is seeded by the batch's tokens and `seed`, so a resumed run draws what the first did;
    `documents`: a packed batch's (`train/packing.py`)."""
    valid = label_valid(loss_mask, config.num_depths, documents)
    generator = batch_generator(seed, input_ids, attention_mask, loss_mask)
    return cod_rows(attention_mask, cod_anchors(valid, config.cod_ratio, config.cod_min_ratio,
                                                generator, documents))


def peagle_loss(drafter: PEagleDrafter, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                loss_mask: torch.Tensor, aux_hidden: list[torch.Tensor],
                target_logits_after: TargetLogits, rows: dict[str, torch.Tensor] | None = None,
                documents: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """P-EAGLE's loss over COD-sampled parallel slots.

    Depth 0 at position i feeds token i+1 and the fused target features at i (EAGLE-3's step 0);
    depth d of anchor i feeds `mask_token_id` and `fc(mask_hidden)` at position i+d. Both are
    trained to match the target's distribution of token i+d+2 over the draft vocabulary where
    that token is in the loss mask (a target choice outside the draft vocabulary is a miss).
    Total = sum_d w_d * mean loss_d (`loss`, `position_weights`: see models/losses.py). Every
    row is gathered by index: with the collate's `rows`, nothing waits on the host.

    Args:
        input_ids, attention_mask, loss_mask: (B, T).
        aux_hidden: three (B, T, H) target layer outputs.
        target_logits_after: the target's logits at trained positions (see layers.TargetLogits).
        rows: the collate's COD draw (`collate_cod_rows`); None = drawn here from the global RNG
            (host reads on a GPU: evaluation and tests).
        documents, position_ids: (B, T) of packed rows (`train/packing.py`): attention, labels
            and the draw stay within a document, each at its own positions; None = one per row.

    Returns:
        (loss, metrics) with `acc_{d}` (top-1 agreement with the target over depth d's sampled
        anchors) and `loss_{d}`.
    """
    cfg = drafter.config
    b, t = input_ids.shape
    if rows is None:
        valid = label_valid(loss_mask, cfg.num_depths, documents)
        rows = cod_rows(attention_mask, cod_anchors(valid, cfg.cod_ratio, cfg.cod_min_ratio,
                                                    documents=documents))
    draft_ids = drafter.draft_ids()
    teacher = getattr(target_logits_after, "teacher_ahead", None)  # the target's thread's
    if teacher is None:
        teacher = restrict_target_logits_at(target_logits_after, draft_ids)
    weights = [cfg.step_weight ** d for d in range(cfg.num_depths)] \
        if cfg.position_weights == "geometric" else decay_weights(cfg.num_depths, cfg.decay_gamma)
    losses = PositionLosses(parse_loss(cfg.loss), cfg.position_weights, weights, b * t,
                            input_ids.device)
    metrics: dict[str, torch.Tensor] = {}
    for d, out in depth_states(drafter, input_ids, aux_hidden, rows, cfg.num_depths, documents,
                               position_ids):
        anchors = rows[f"anchors.{d}"]  # (m,) flat anchor positions
        states = out[rows["scored"]] if d == 0 else out
        with torch.no_grad():  # the target after position a + d + 1 (token a + d + 2)
            teacher_rows, target_choice = teacher(anchors + 1 + d)
            in_vocab = drafter.t2d[target_choice]
        logp = torch.log_softmax(drafter.head(states).float(), dim=-1)
        depth_loss = losses.add_rows(d, logp, teacher_rows, in_vocab, anchors,
                                     missed=~in_vocab)
        hits = in_vocab & (draft_ids[row_argmax(logp)] == target_choice)
        metrics[f"loss_{d}"] = depth_loss
        metrics[f"acc_{d}"] = hits.sum().float() / max(anchors.shape[0], 1)
    return losses.total(), metrics


def depth_states(drafter: PEagleDrafter, input_ids: torch.Tensor, aux_hidden: list[torch.Tensor],
                 rows: dict[str, torch.Tensor], depths: int,
                 documents: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
                 ) -> Iterator[tuple[int, torch.Tensor]]:
    """The training forward, one depth at a time, on packed rows (EAGLE-3's `step_rows`).

    Depth 0 runs `rows["packed"]` (every real token and every depth-0 anchor: the keys later
    depths read); depth d > 0 runs its anchors `rows["anchors.{d}"]` alone, each at position
    anchor + d with the mask token and feature.

    Args:
        input_ids: (B, T), right-padded.
        aux_hidden: three (B, T, H) target layer outputs.
        rows: a COD draw's rows (`cod_rows`).
        depths: the depths to run (<= the draw's).
        documents, position_ids: (B, T) of packed rows (`train/packing.py`), or None.

    Yields:
        (depth, the states of its rows (m, H), in the order of its rows).
    """
    b, t = input_ids.shape
    positions = None if position_ids is None else position_ids.flatten()
    flat = rows["packed"]
    hidden = drafter.fuse([aux.flatten(0, 1)[flat] for aux in aux_hidden])  # (m, H)
    tokens = shift_left(input_ids, 1).flatten()[flat]
    cache: list[KV] = []
    for d in range(depths):
        if d > 0:
            flat = rows[f"anchors.{d}"]
            tokens = input_ids.new_full(flat.shape, drafter.config.mask_token_id)
            hidden = drafter.mask_feature().expand(flat.shape[0], -1)
        at = (flat % t if positions is None else positions[flat]) + d
        out, kv = drafter.step_rows(tokens, hidden, at, flat, (b, t), cache, documents)
        cache = [*cache, kv]
        yield d, out
