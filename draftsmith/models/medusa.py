"""Medusa heads: K heads on the target's last hidden state, head k predicting token t+2+k.

Head k = ResBlock x L then Linear(H -> V); ResBlock(x) = x + SiLU(Linear(x)) with the linear
initialised to zero. Module names match the Medusa checkpoint (`{k}.{j}.linear`, `{k}.{L}`).
With `shared_head` every head ends in one frozen copy of the target's own output layer
(`lm_head`) instead, so only the ResBlocks train.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.models.layers import TargetLogits, offset_in_sequence
from draftsmith.models.losses import (
    PositionLosses,
    check_labels,
    check_position_weights,
    decay_weights,
    parse_loss,
    row_argmax,
    wide,
)


@dataclass
class MedusaConfig:
    """Medusa settings.

    Attributes:
        num_heads: K heads (3-5 in the reference).
        num_layers: ResBlocks per head.
        head_weight: lambda_k = head_weight ** k.
        lora: Medusa-2: train the target jointly through LoRA (r, alpha on attention and MLP).
        lora_r, lora_alpha: LoRA rank and alpha for Medusa-2.
        heads_weight_joint: weight of the heads' loss next to the target's own loss (Medusa-2).
        labels: `target` (default): each head learns the target's distribution of its token
            (soft cross-entropy: acceptance is decided by the target's choice); `data`: the
            data's tokens (hard labels; right when the data is the target's own answers).
        shared_head: every head reads its logits through the target's frozen output layer and
            trains its ResBlocks only (no V x H layer per head: 28M parameters each on a 49k x
            576 target); False: a trainable output layer per head, started from the target's.
        loss: per-head loss against the target (`labels: target`): kl (default), tv, lk, ce or
            a mixture such as {ce: 0.1, tv: 0.9} (see models/losses.py).
        position_weights: `geometric` (head_weight ** k, default), `decay` (exp(-k /
            decay_gamma)) or `dpace` (D-PACE, per position from the heads' label
            probabilities).
        decay_gamma: gamma of `decay`.
    """

    num_heads: int = 4
    num_layers: int = 1
    head_weight: float = 0.8
    lora: bool = False
    lora_r: int = 32
    lora_alpha: int = 16
    heads_weight_joint: float = 0.2
    labels: str = "target"
    shared_head: bool = False
    loss: str | dict = "kl"
    position_weights: str = "geometric"
    decay_gamma: float = 4.0

    def __post_init__(self):
        check_labels(self.labels, parse_loss(self.loss))
        check_position_weights(self.position_weights, self.decay_gamma)
        if self.num_heads < 1 or self.num_layers < 0:
            raise ValueError(f"num_heads={self.num_heads} must be >= 1 and num_layers="
                             f"{self.num_layers} >= 0")
        if self.shared_head and self.num_layers < 1:
            raise ValueError("shared_head=true trains the ResBlocks only, but num_layers=0 "
                             "leaves nothing to train; set num_layers >= 1")


class ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """The K heads; `forward(h)` returns (K, B, T, V) logits.

    `heads[k]` is head k's ResBlocks followed by its own output layer, or, with `shared_head`,
    its ResBlocks alone, all heads then ending in `lm_head`: a frozen copy of the target's.
    """

    kind = "medusa"

    def __init__(self, target_config, config: MedusaConfig):
        super().__init__()
        hidden, vocab = target_config.hidden_size, target_config.vocab_size
        self.config = config

        def head_layers() -> list[nn.Module]:
            blocks = [ResBlock(hidden) for _ in range(config.num_layers)]
            return blocks if config.shared_head else [*blocks, nn.Linear(hidden, vocab, bias=False)]

        self.heads = nn.ModuleList(nn.Sequential(*head_layers()) for _ in range(config.num_heads))
        if config.shared_head:
            self.lm_head = nn.Linear(hidden, vocab, bias=False).requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def init_from_target(self, target: nn.Module) -> None:
        head = target.get_output_embeddings().weight.data
        for layer in [self.lm_head] if self.config.shared_head else [b[-1] for b in self.heads]:
            layer.weight.data.copy_(head)

    def head(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Head k's logits. (..., H) -> (..., V)"""
        out = self.heads[k](hidden.to(self.dtype))
        return self.lm_head(out) if self.config.shared_head else out

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.head(k, hidden) for k in range(len(self.heads))])


def medusa_loss(heads: MedusaHeads, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                features: torch.Tensor, target_logits_after: TargetLogits,
                position_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """sum_k w^k CE(head_k(h_t), label of token t+2+k) over loss-masked targets, the label being
    the target's distribution of that token (logits at t+1+k; `labels: target`) or the data's
    token (`labels: data`). Accuracy of head k is its agreement with the target's own greedy
    choice for that token. Head k's rows are i = p - 1 - k for the trained positions p the
    collate counted on the host (`trained_positions`), gathered (no host count); the target's
    logits after p serve every head. In packed rows (`position_ids`: `train/packing.py`) a
    head's row stays in p's document."""
    cfg = heads.config
    t = input_ids.shape[1]
    num_heads = len(heads.heads)
    weights = [cfg.head_weight ** k for k in range(num_heads)] \
        if cfg.position_weights == "geometric" else decay_weights(num_heads, cfg.decay_gamma)
    losses = PositionLosses(parse_loss(cfg.loss), cfg.position_weights, weights, input_ids.numel(),
                            features.device)
    metrics = {}
    trained = target_logits_after.trained_positions(loss_mask)  # (m,) flat p: token p + 1
    teacher = target_logits_after.every_at(trained)  # (m, V)
    tokens = input_ids.flatten()[trained + 1] if cfg.labels == "data" else None
    offsets = offset_in_sequence(trained, t, position_ids)
    for k in range(num_heads):
        valid = offsets > k  # the row p - 1 - k lies in p's sequence
        rows = (trained - 1 - k).clamp_min(0)
        logits = wide(heads.head(k, features.flatten(0, 1)[rows]))
        head_loss = losses.add_rows(k, torch.log_softmax(logits, dim=-1), teacher, valid, rows,
                                    tokens=tokens)
        hits = valid & (row_argmax(logits) == row_argmax(teacher))
        metrics[f"loss_{k}"] = head_loss
        metrics[f"acc_{k}"] = hits.sum().float() / valid.sum().clamp_min(1)
    return losses.total(), metrics
