"""Medusa heads: K heads on the target's last hidden state, head k predicting token t+2+k.

Head k = ResBlock x L then Linear(H -> V); ResBlock(x) = x + SiLU(Linear(x)) with the linear
initialised to zero. Module names match the Medusa checkpoint (`{k}.{j}.linear`, `{k}.{L}`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.models.layers import LABEL_SOURCES, TargetLogits, shift_left, token_loss_sum


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
    """

    num_heads: int = 4
    num_layers: int = 1
    head_weight: float = 0.8
    lora: bool = False
    lora_r: int = 32
    lora_alpha: int = 16
    heads_weight_joint: float = 0.2
    labels: str = "target"

    def __post_init__(self):
        if self.labels not in LABEL_SOURCES:
            raise ValueError(f"labels={self.labels!r}: use one of {', '.join(LABEL_SOURCES)}")
        if self.num_heads < 1 or self.num_layers < 0:
            raise ValueError(f"num_heads={self.num_heads} must be >= 1 and num_layers="
                             f"{self.num_layers} >= 0")


class ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """The K heads; `forward(h)` returns (K, B, T, V) logits."""

    kind = "medusa"

    def __init__(self, target_config, config: MedusaConfig):
        super().__init__()
        hidden, vocab = target_config.hidden_size, target_config.vocab_size
        self.config = config
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden) for _ in range(config.num_layers)],
                          nn.Linear(hidden, vocab, bias=False))
            for _ in range(config.num_heads))

    def init_from_target(self, target: nn.Module) -> None:
        head = target.get_output_embeddings().weight.data
        for block in self.heads:
            block[-1].weight.data.copy_(head)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.to(self.heads[0][-1].weight.dtype)
        return torch.stack([head(hidden) for head in self.heads])


def medusa_loss(heads: MedusaHeads, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                features: torch.Tensor, target_logits_after: TargetLogits
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """sum_k w^k CE(head_k(h_t), label of token t+2+k) over loss-masked targets, the label being
    the target's distribution of that token (logits at t+1+k; `labels: target`) or the data's
    token (`labels: data`). Accuracy of head k is its agreement with the target's own greedy
    choice for that token. Heads run only on trained positions."""
    t = input_ids.shape[1]
    index = torch.arange(t, device=input_ids.device)[None]
    dtype = heads.heads[0][-1].weight.dtype
    total = features.new_zeros((), dtype=torch.float32)
    metrics = {}
    for k, head in enumerate(heads.heads):
        valid = (shift_left(loss_mask, 2 + k) > 0) & (index < t - 2 - k)
        count = valid.sum().clamp_min(1)
        logits = head(features[valid].to(dtype)).float()
        teacher = target_logits_after(valid, 1 + k)
        head_loss = token_loss_sum(logits, teacher, shift_left(input_ids, 2 + k)[valid],
                                   heads.config.labels) / count
        total = total + heads.config.head_weight ** k * head_loss
        hits = logits.argmax(-1) == teacher.argmax(-1)
        metrics[f"loss_{k}"] = head_loss.detach()
        metrics[f"acc_{k}"] = hits.sum().float() / count
    return total, metrics
