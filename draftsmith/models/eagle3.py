"""EAGLE-3 drafter: fused low/mid/high target features, one 2H-wide decoder layer, a reduced draft
vocabulary, and training-time test (TTT): the drafter is unrolled on its own outputs during training.

Weight names follow the official/SGLang checkpoint (`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`,
`t2d`); see ../shared/REFERENCE.md section 1 and 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from draftsmith.draft_vocab.drafter import DraftVocabMixin
from draftsmith.errors import DraftsmithError
from draftsmith.models.layers import (
    KV,
    DraftDecoderLayer,
    Rotary,
    TargetLogits,
    drafter_layer_config,
    shift_left,
)
from draftsmith.models.losses import (
    PositionLosses,
    check_position_weights,
    decay_weights,
    parse_loss,
    row_argmax,
    wide,
)
from draftsmith.models.ttt_rows import ttt_row_plan


def eagle3_layer_ids(num_layers: int) -> list[int]:
    """0-based target layer outputs fused by EAGLE-3 (low, mid, high).

    [1, N//2 - 1, N - 4] as in the reference code, SpecForge and vLLM for N >= 8. Shallower targets
    repeat layers with that formula (N = 4 gives [1, 1, 0]), which no engine can serve, so they
    get three evenly spread distinct layers instead: [0, (N-1)//2, N-1].

    Raises:
        DraftsmithError: N < 3 (EAGLE-3 fuses three distinct layers).
    """
    if num_layers >= 8:
        return [1, num_layers // 2 - 1, num_layers - 4]
    if num_layers >= 3:
        return [0, (num_layers - 1) // 2, num_layers - 1]
    raise DraftsmithError(
        f"EAGLE-3 fuses three distinct target layers but the target has num_hidden_layers="
        f"{num_layers}; use a deeper target or another drafter kind (eagle1, medusa, mtp)")


def check_eagle3_layer_ids(ids: list[int], num_layers: int) -> None:
    """Aux layer ids must be three strictly increasing 0-based layer outputs inside the target
    (vLLM and SGLang capture each layer once, in layer order).

    Raises:
        DraftsmithError: naming `drafter.layer_ids`, the ids and the valid range.
    """
    valid = len(ids) == 3 and all(0 <= i < num_layers for i in ids) and ids == sorted(set(ids))
    if not valid:
        raise DraftsmithError(
            f"EAGLE-3 aux layer ids (drafter.layer_ids) {list(ids)} must be 3 strictly increasing "
            f"0-based layer outputs in 0..{num_layers - 1} (the target has num_hidden_layers="
            f"{num_layers}); set drafter.layer_ids accordingly, or leave it unset for the default "
            f"{eagle3_layer_ids(num_layers) if num_layers >= 3 else 'of a deeper target'}")


@dataclass
class Eagle3Config:
    """EAGLE-3 settings.

    Attributes:
        draft_vocab_size: Vd, tokens the drafter can propose (<= target vocab).
        ttt_steps: training-time test unroll depth (reference code 7, paper 5, speculators 3).
        step_weight: loss weight decay per TTT step (0.8 in the reference).
        layer_ids: target layer outputs to fuse; None = `eagle3_layer_ids(N)`.
        fc_norm: EAGLE-3.1: one RMSNorm per fused layer output before `fc` (`fc_norm.{0,1,2}`).
        norm_output: EAGLE-3.1: the final norm's output feeds both the head (no second norm) and
            the next TTT / draft step (EAGLE-3 feeds back the un-normed state).
        loss: per-step loss against the target's distribution over the draft vocabulary: kl
            (soft cross-entropy, default), tv, lk, ce or a mixture such as {ce: 0.1, tv: 0.9}
            (see models/losses.py).
        position_weights: `geometric` (step_weight ** j, default), `decay` (exp(-j /
            decay_gamma)) or `dpace` (D-PACE, per position from the draft's probability of
            the target's choice at every step).
        decay_gamma: gamma of `decay`.
        freeze_head: the draft head keeps the target's rows for the draft vocabulary and is not
            trained (speculators' recipe: its `lm_head` has requires_grad False); it is still
            saved with the drafter, since engines read the draft-vocabulary rows from it.
    """

    draft_vocab_size: int = 32000
    ttt_steps: int = 7
    step_weight: float = 0.8
    layer_ids: list[int] | None = None
    fc_norm: bool = False
    norm_output: bool = False
    loss: str | dict = "kl"
    position_weights: str = "geometric"
    decay_gamma: float = 4.0
    freeze_head: bool = False

    def __post_init__(self):
        if self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must be >= 1")
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps={self.ttt_steps} must be >= 1")
        parse_loss(self.loss)
        check_position_weights(self.position_weights, self.decay_gamma)

    @property
    def eagle31(self) -> bool:
        """Any EAGLE-3.1 setting on (served by vLLM and SGLang; not by llama.cpp)."""
        return self.fc_norm or self.norm_output


class Eagle3Midlayer(DraftDecoderLayer):
    """The decoder layer with EAGLE-3's two input norms (2H-wide attention input)."""

    def __init__(self, config):
        super().__init__(config, 2 * config.hidden_size)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def run(self, embeds, hidden, cos, sin, mask, past=None, extra_kv=None):
        attn_input = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        return self(attn_input, hidden, cos, sin, mask, past, extra_kv)

    def run_rows(self, embeds, hidden, cos, sin, rows, shape, extra_kv, documents=None):
        """`run` on packed rows (see DraftDecoderLayer.forward_rows)."""
        attn_input = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        return self.forward_rows(attn_input, hidden, cos, sin, rows, shape, extra_kv, documents)


class Eagle3Drafter(DraftVocabMixin, nn.Module):
    """EAGLE-3 drafter for a given target config (EAGLE-3.1 with `fc_norm` / `norm_output`).

    Frozen parts copied from the target: `embed_tokens`, and `lm_head` with `freeze_head`.
    Trained: `fc`, `midlayer`, `norm`, `lm_head` (over the draft vocabulary, started from the
    target's rows), `fc_norm` (EAGLE-3.1). Buffers: `d2t` (int64 [Vd]) and `t2d` (bool [V]).
    """

    kind = "eagle3"

    def __init__(self, target_config, config: Eagle3Config):
        super().__init__()
        layer_config = drafter_layer_config(target_config)
        hidden = layer_config.hidden_size
        vocab = target_config.vocab_size
        vd = min(config.draft_vocab_size, vocab)
        self.config = config
        self.layer_config = layer_config
        num_layers = target_config.num_hidden_layers
        self.layer_ids = list(config.layer_ids or eagle3_layer_ids(num_layers))
        check_eagle3_layer_ids(self.layer_ids, num_layers)
        self.embed_tokens = nn.Embedding(vocab, hidden).requires_grad_(False)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList(LlamaRMSNorm(hidden, layer_config.rms_norm_eps)
                                         for _ in self.layer_ids)
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        self.midlayer = Eagle3Midlayer(layer_config)
        self.norm = LlamaRMSNorm(hidden, layer_config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, vd, bias=False).requires_grad_(not config.freeze_head)
        self.rotary = Rotary(layer_config)
        self.add_draft_vocab(vd, vocab)

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.out_features

    def init_from_target(self, target: nn.Module) -> None:
        """Copy the frozen embedding and start the draft head from the target's head rows."""
        self.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight.data)
        head = target.get_output_embeddings().weight.data
        self.lm_head.weight.data.copy_(head[self.draft_ids()])

    def fuse(self, aux_hidden: list[torch.Tensor]) -> torch.Tensor:
        """fc(cat(low, mid, high)), each normed first with `fc_norm`: target features -> drafter
        hidden. (..., H)"""
        dtype = self.fc.weight.dtype
        if self.config.fc_norm:
            aux_hidden = [norm(h.to(dtype)) for norm, h in zip(self.fc_norm, aux_hidden,
                                                              strict=True)]
        return self.fc(torch.cat(aux_hidden, dim=-1).to(dtype))

    def feedback(self, out: torch.Tensor) -> torch.Tensor:
        """The decoder layer's output as the state the head and the next step read: normed once
        with `norm_output` (EAGLE-3.1), as is otherwise."""
        return self.norm(out) if self.config.norm_output else out

    def head(self, state: torch.Tensor) -> torch.Tensor:
        """Draft logits (..., Vd) of a state from `step`: `lm_head(norm(h))`, or `lm_head(h)`
        when `norm_output` has normed it already."""
        return self.lm_head(state if self.config.norm_output else self.norm(state))

    def warm_teacher(self, features) -> None:
        """What `eagle3_loss` reads of the target's head for this batch (`restricted_teacher`),
        computed now: on the target's thread, beside the step before (`train.overlap_target`)."""
        features.teacher_ahead = restricted_teacher(self, features, features.loss_mask)

    def target_feature(self, last_hidden: torch.Tensor, hidden_states, index) -> torch.Tensor:
        """Drafter input of target positions `index`: fc of the fused layer outputs. (m, H)"""
        return self.fuse([hidden_states[layer + 1][index] for layer in self.layer_ids])

    def draft(self, tokens, hidden, position_ids, mask, past=None, last_only: bool = False):
        """Decode-time step on one sequence: (m,) tokens, (m, H) hidden ->
        (next hidden (m, H), log-probs over the target vocab (m or 1, V), new (keys, values)).
        `last_only`: the head runs on the last row only (the one a new tree grows from)."""
        out, kv = self.step(tokens[None], hidden[None], position_ids[None], mask, past,
                            with_logits=False)
        rows = out[0][-1:] if last_only else out[0]
        logp = torch.log_softmax(self.head(rows).float(), -1)
        full = logp.new_full((logp.shape[0], self.t2d.shape[0]), float("-inf"))
        full[:, self.draft_ids()] = logp
        return out[0], full, kv

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
             mask: torch.Tensor | None, past: KV | None = None,
             extra_kv: list[KV] | None = None, with_logits: bool = True):
        """One drafter pass. tokens (B, T), hidden (B, T, H) ->
        (h_out, draft logits (B, T, Vd), kv), or (h_out, kv) when `with_logits` is False."""
        embeds = self.embed_tokens(tokens).to(hidden.dtype)
        cos, sin = self.rotary(hidden, position_ids)
        out, kv = self.midlayer.run(embeds, hidden, cos, sin, mask, past, extra_kv)
        out = self.feedback(out)
        if not with_logits:
            return out, kv
        return out, self.head(out), kv

    def step_rows(self, tokens: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                  rows: torch.Tensor, shape: tuple[int, int], extra_kv: list[KV],
                  documents: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """A training-time-test step (without logits) on packed rows: tokens (m,), hidden (m, H)
        and position ids (m,) at flat positions `rows` of a right-padded (B, T) layout, after the
        earlier steps' `extra_kv` -> (h_out (m, H), padded (keys, values)); the attention pattern
        is `ttt_masks`', computed without it (`ttt_attention`), within each of `documents` when
        the rows are packed (`train/packing.py`)."""
        embeds = self.embed_tokens(tokens).to(hidden.dtype)
        cos, sin = self.rotary(hidden[None], position_ids[None])
        out, kv = self.midlayer.run_rows(embeds, hidden, cos, sin, rows, shape, extra_kv,
                                         documents)
        return self.feedback(out), kv


def collate_ttt_rows(config: Eagle3Config, seed: int, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                     documents: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """A batch's `ttt_row_plan`, made by the training collate on the host (registry
    `collate_rows`; nothing is drawn, so `seed` and the tokens are unused)."""
    return ttt_row_plan(attention_mask, loss_mask, config.ttt_steps, documents)


def restricted_teacher(drafter: Eagle3Drafter, target_logits_after: TargetLogits,
                       loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """After each trained position (m of them): the target's logits over the draft vocabulary
    (m, Vd) and its full-vocabulary choice (m,), no gradient; taken from `teacher_ahead` when
    the target's thread computed them (`Eagle3Drafter.warm_teacher`)."""
    ahead = getattr(target_logits_after, "teacher_ahead", None)
    if ahead is not None:
        return ahead
    trained = target_logits_after.trained_positions(loss_mask)  # (m,) flat p
    with torch.no_grad():
        return target_logits_after.restricted_every_at(drafter.draft_ids(), trained)


def eagle3_loss(drafter: Eagle3Drafter, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                loss_mask: torch.Tensor, aux_hidden: list[torch.Tensor],
                target_logits_after: TargetLogits, plan: dict[str, torch.Tensor] | None = None,
                documents: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Training-time-test loss of EAGLE-3.

    Step j at position i feeds token i+1+j and the previous step's output (step 0: fused target
    features at i), and is trained to match the target's distribution for token i+j+2 restricted
    to the draft vocabulary, where that token is in the loss mask and the target's argmax is in the
    draft vocabulary. Total = sum_j w_j * mean loss_j: soft cross-entropy and w_j = step_weight^j
    by default (`loss`, `position_weights`: see models/losses.py).

    Work is spent only where it is used: the decoder layer's row-wise parts run on every real
    token at step 0 and on the positions trained at that step or later afterwards (`ttt_rows`),
    only attention in the padded (B, T) layout; the heads run on the rows each step trains, and
    the target's logits are read once for every step at the positions the collate counted
    (`trained_positions`). Every row is gathered by index from `plan`: with the collate's,
    nothing waits on the host. The loss is that of running every step on the whole batch.

    Args:
        input_ids, attention_mask, loss_mask: (B, T), right-padded.
        aux_hidden: three (B, T, H) target layer outputs.
        target_logits_after: the target's logits (see layers.TargetLogits).
        plan: the collate's `ttt_row_plan`; None = counted here (host reads on a GPU).
        documents, position_ids: (B, T) of packed rows (`train/packing.py`): attention and
            labels stay within a document, each at its own positions; None = one per row.

    Returns:
        (loss, metrics) with metrics `acc_{j}` (top-1 agreement with the target over every trained
        position: a target choice outside the draft vocabulary counts as a miss, as it is at
        decode time, so acc and simulated tau compare with the other kinds') and `loss_{j}`;
        every value a tensor.
    """
    cfg = drafter.config
    b, t = input_ids.shape
    if plan is None:
        plan = ttt_row_plan(attention_mask, loss_mask, cfg.ttt_steps, documents)
    positions = position_ids.flatten() if position_ids is not None else None
    draft_ids = drafter.draft_ids()
    teacher, choice = restricted_teacher(drafter, target_logits_after, loss_mask)
    with torch.no_grad():
        in_vocab = drafter.t2d[choice]
    rows = plan["rows.0"]
    hidden = drafter.fuse([aux.flatten(0, 1)[rows] for aux in aux_hidden])  # (m0, H)
    cache: list[KV] = []
    weights = [cfg.step_weight ** j for j in range(cfg.ttt_steps)] \
        if cfg.position_weights == "geometric" else decay_weights(cfg.ttt_steps, cfg.decay_gamma)
    losses = PositionLosses(parse_loss(cfg.loss), cfg.position_weights, weights, b * t,
                            hidden.device)
    metrics: dict[str, torch.Tensor] = {}
    for j in range(cfg.ttt_steps):
        if j > 0:  # this step computes a subset of the last one's rows
            rows, hidden = plan[f"rows.{j}"], hidden[plan[f"keep.{j}"]]
        tokens = shift_left(input_ids, 1 + j).flatten()[rows]
        at = (rows % t if positions is None else positions[rows]) + j
        hidden, kv = drafter.step_rows(tokens, hidden, at, rows, (b, t), cache, documents)
        cache = [*cache, kv]
        label = plan[f"label.{j}"]
        scored = in_vocab[label]
        logp = torch.log_softmax(wide(drafter.head(hidden[plan[f"head.{j}"]])), dim=-1)
        step_loss = losses.add_rows(j, logp, teacher[label], scored, plan[f"source.{j}"],
                                    missed=~scored)
        hits = scored & (draft_ids[row_argmax(logp)] == choice[label])
        metrics[f"loss_{j}"] = step_loss
        metrics[f"acc_{j}"] = hits.sum().float() / max(label.shape[0], 1)
    return losses.total(), metrics
