"""EAGLE-1 drafter (also EAGLE-2's: only the inference tree differs): predicts the target's next
feature from (embedding of the next token, current feature) with one decoder layer; tokens come
from the target's frozen head. Weight names follow the EAGLE-1/2 checkpoint (`fc`, `layers.0.*`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.models.layers import (
    KV,
    DraftDecoderLayer,
    Rotary,
    TargetLogits,
    drafter_layer_config,
    offset_in_sequence,
    self_attention_mask,
    sequence_positions,
    shift_left,
)
from draftsmith.models.losses import parse_loss, per_row_loss, row_argmax, wide


@dataclass
class Eagle1Config:
    """EAGLE-1 settings.

    Attributes:
        feature_noise: half-width of the uniform noise added to input features in training.
        feature_weight: weight of the feature regression (SmoothL1) loss.
        token_weight: weight of the token loss through the frozen head (0.1 in the paper).
        loss: that token loss against the target's distribution: kl (soft cross-entropy, the
            paper's; default), tv, lk, ce or a mixture such as {ce: 0.1, tv: 0.9} (see
            models/losses.py).
        fc_bias: train a bias in `fc`, as the EAGLE-1 reference does. Off by default: vLLM's
            EAGLE loader builds `fc` without a bias and drops the tensor, so a trained bias would
            serve a different drafter there; SGLang serves either. Off, `fc.bias` is a zero
            buffer, so the tensor every EAGLE-1/2 checkpoint carries is still there, and a drafter
            trained before this setting existed loads its trained bias into it unchanged.
    """

    feature_noise: float = 0.1
    feature_weight: float = 1.0
    token_weight: float = 0.1
    loss: str | dict = "kl"
    fc_bias: bool = False

    def __post_init__(self):
        parse_loss(self.loss)


class Eagle1Drafter(nn.Module):
    """fc(cat(embed(t_{i+1}), f_i)) -> one decoder layer without input norm -> predicted f_{i+1}.

    Frozen parts copied from the target: `embed_tokens`, `lm_head`.
    """

    kind = "eagle1"

    def __init__(self, target_config, config: Eagle1Config):
        super().__init__()
        layer_config = drafter_layer_config(target_config)
        hidden = layer_config.hidden_size
        self.config = config
        self.layer_config = layer_config
        self.embed_tokens = nn.Embedding(target_config.vocab_size, hidden).requires_grad_(False)
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        if not config.fc_bias:  # not trained: a zero buffer under the same name
            del self.fc.bias
            self.fc.register_buffer("bias", torch.zeros(hidden))
        self.layers = nn.ModuleList([DraftDecoderLayer(layer_config, hidden)])
        self.lm_head = nn.Linear(hidden, target_config.vocab_size, bias=False).requires_grad_(False)
        self.rotary = Rotary(layer_config)

    def init_from_target(self, target: nn.Module) -> None:
        self.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight.data)
        self.lm_head.weight.data.copy_(target.get_output_embeddings().weight.data)

    def step(self, tokens: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor,
             mask: torch.Tensor | None, past: KV | None = None) -> tuple[torch.Tensor, KV]:
        """tokens (B, T) (the token after each feature), features (B, T, H) -> predicted features."""
        dtype = self.fc.weight.dtype
        embeds = self.embed_tokens(tokens).to(dtype)
        x = self.fc(torch.cat([embeds, features.to(dtype)], dim=-1))
        cos, sin = self.rotary(x, position_ids)
        return self.layers[0](x, x, cos, sin, mask, past)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(features)

    def target_feature(self, last_hidden: torch.Tensor, hidden_states, index) -> torch.Tensor:
        """Drafter input features of target positions `index`: the last hidden state. (m, H)"""
        return last_hidden[index]

    def draft(self, tokens, features, position_ids, mask, past=None, last_only: bool = False):
        """Decode-time step on one sequence: (m,) tokens, (m, H) features ->
        (next features (m, H), log-probs over the target vocab (m or 1, V), new (keys, values)).
        `last_only`: the head runs on the last row only (the one a new tree grows from)."""
        predicted, kv = self.step(tokens[None], features[None], position_ids[None], mask, past)
        rows = predicted[0][-1:] if last_only else predicted[0]
        return predicted[0], torch.log_softmax(self.logits(rows).float(), -1), kv


def eagle1_loss(drafter: Eagle1Drafter, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                loss_mask: torch.Tensor, features: torch.Tensor,
                target_logits_after: TargetLogits, documents: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SmoothL1(f_pred, f_next) + w * token loss(target head on f_next, head on f_pred), masked
    (the token loss is `loss`: soft cross-entropy by default).

    Position i feeds token i+1 and the target feature f_i (plus uniform noise in training) and
    predicts f_{i+1}, trained where token i+2 is in the loss mask: the rows i = p - 1 of the
    trained positions p the collate counted on the host (`trained_positions`), gathered, so
    nothing waits on a host count. Packed rows (`documents`, `position_ids`:
    `train/packing.py`) attend within each document, at its own positions.
    """
    cfg = drafter.config
    t = input_ids.shape[1]
    inputs = features
    if drafter.training and cfg.feature_noise > 0:
        inputs = features + (torch.rand_like(features) * 2 - 1) * cfg.feature_noise
    predicted, _ = drafter.step(shift_left(input_ids, 1), inputs,
                                sequence_positions(input_ids, position_ids),
                                self_attention_mask(attention_mask, documents))
    trained = target_logits_after.trained_positions(loss_mask)  # (m,) flat p: token p + 1
    valid = offset_in_sequence(trained, t, position_ids) > 0  # the row p - 1 in p's sequence
    count = valid.sum().clamp_min(1)
    predicted = predicted.flatten(0, 1)[(trained - 1).clamp_min(0)]  # (m, H)
    feature_loss = F.smooth_l1_loss(wide(predicted), wide(features.flatten(0, 1)[trained]),
                                    reduction="none").mean(-1)
    feature_loss = torch.where(valid, feature_loss, 0.0).sum() / count
    draft_logp = torch.log_softmax(wide(drafter.logits(predicted)), dim=-1)
    teacher = target_logits_after.every_at(trained)
    token_loss = torch.where(valid, per_row_loss(draft_logp, teacher, parse_loss(cfg.loss),
                                                  valid), 0.0).sum() / count
    loss = cfg.feature_weight * feature_loss + cfg.token_weight * token_loss
    hits = valid & (row_argmax(draft_logp) == row_argmax(teacher))
    return loss, {"feature_loss": feature_loss.detach(), "token_loss": token_loss.detach(),
                  "acc_0": hits.sum().float() / count}
