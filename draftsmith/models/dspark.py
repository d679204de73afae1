"""DSpark: DFlash's block drafter with the shifted layout, a sequential Markov head and a
confidence head (DeepSpec; ../shared/REFERENCE.md section 7.2).

Block row k predicts the token at anchor + 1 + k, so a block of B proposes B tokens. The Markov
head adds `W2(W1[x_{k-1}])` to row k's logits (x_{-1} = the anchor), so drafting is one parallel
pass and then a cheap left-to-right chain. The confidence head estimates, per row, the acceptance
1 - TV(p_draft, p_target); decoding may cut the block where it falls below a threshold.

Loss (DeepSpec): 0.1 CE on the data tokens + 0.9 L1 between the draft and target distributions
(2 x TV) + 1.0 BCE of the confidence against clamp(1 - L1/2, 0, 1), each weighted by exp(-k/gamma)
over the block's contiguous trained prefix and normalised by its weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.models.block_loss import position_weights, scatter_trained, training_blocks
from draftsmith.models.dflash import DFlashConfig, DFlashDrafter
from draftsmith.models.losses import row_argmax


@dataclass
class DSparkConfig(DFlashConfig):
    """DSpark settings: DFlash's, with DeepSpec's defaults, plus its heads.

    Attributes:
        markov_rank: r of the Markov head's token embedding W1 (V, r) and W2 (r -> V).
        confidence_threshold: decoding cuts a chain at the first proposal whose confidence is
            below this (0 keeps the whole block).
        ce_weight, l1_weight, confidence_weight: the loss terms' weights.
    """

    block_size: int = 7
    decay_gamma: float | None = 4.0
    markov_rank: int = 256
    confidence_threshold: float = 0.0
    ce_weight: float = 0.1
    l1_weight: float = 0.9
    confidence_weight: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if self.loss != "kl":
            raise ValueError(f"loss={self.loss!r}: DSpark's loss is its own (CE + L1 + confidence "
                             "BCE); weigh its terms with ce_weight, l1_weight, confidence_weight")
        if self.draft_vocab_size is not None:
            raise ValueError("draft_vocab_size: DSpark's Markov head and its CE on the data's "
                             "tokens cover the whole vocabulary; leave it unset (DFlash takes one)")
        if self.markov_rank < 1:
            raise ValueError(f"markov_rank={self.markov_rank} must be >= 1")
        if not 0 <= self.confidence_threshold < 1:
            raise ValueError(f"confidence_threshold={self.confidence_threshold} must be in [0, 1)")


class MarkovHead(nn.Module):
    """`W2(W1[previous token])`: a bias on each row's logits from the token before it."""

    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)
        nn.init.zeros_(self.markov_w2.weight)  # starts as plain DFlash logits

    def forward(self, previous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(...,) previous tokens -> (bias (..., V), their embedding (..., r))."""
        embedded = self.markov_w1(previous)
        return self.markov_w2(embedded), embedded


class ConfidenceHead(nn.Module):
    """`Linear([h_k; W1[x_{k-1}]] -> 1)`: the logit of row k's expected acceptance."""

    def __init__(self, hidden: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden + rank, 1)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([hidden, embedded.to(hidden.dtype)], -1))[..., 0]


class DSparkDrafter(DFlashDrafter):
    """DSpark drafter: DFlash's body with `label_shift` 1, `markov_head` and `confidence_head`."""

    label_shift = 1

    def __init__(self, target_config, config: DSparkConfig):
        super().__init__(target_config, config)
        hidden, vocab = self.layer_config.hidden_size, target_config.vocab_size
        self.markov_head = MarkovHead(vocab, config.markov_rank)
        self.confidence_head = ConfidenceHead(hidden, config.markov_rank)

    def row_logits(self, hidden: torch.Tensor, previous: torch.Tensor,
                   base: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of rows (..., H) given each row's previous token (...,): (logits (..., V) float,
        confidence logits (...,)). `base`: the rows' logits without the Markov bias
        (`logits(hidden)`) where already computed: decoding computes a block's rows in one
        product instead of one per row or node."""
        bias, embedded = self.markov_head(previous)
        logits = (self.logits(hidden) if base is None else base) + bias.float()
        return logits, self.confidence_head(hidden, embedded).float()


def dspark_loss(drafter: DSparkDrafter, features) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DeepSpec's loss over every trained proposal of every drawn block (see the module docstring).

    Returns:
        (loss, metrics) with `acc_{k}` (top-1 agreement with the target's choice at proposal k,
        Markov bias included) and `confidence_error` (mean |sigmoid(c) - c*|).
    """
    cfg = drafter.config
    plan = training_blocks(drafter, features)
    anchors, trained, selected = plan["anchors"], plan["trained"], plan["selected"]
    # (Bt, N, B, H): every row proposes
    hidden = drafter.train_hidden(features, anchors, plan["reach"], plan.get("starts"))
    bt = anchors.shape[0]
    batch_index = torch.arange(bt, device=anchors.device)[:, None, None].expand(
        trained.shape).flatten()[selected]
    label_positions = (anchors[..., None] + torch.arange(1, trained.shape[-1] + 1,
                                                         device=anchors.device)).flatten()[selected]
    previous = features.input_ids[batch_index, label_positions - 1]  # teacher forcing
    labels = features.input_ids[batch_index, label_positions]
    logits, confidence = drafter.row_logits(hidden.flatten(0, 2)[selected], previous)
    with torch.no_grad():
        teacher = torch.softmax(features.logits_at(batch_index, label_positions - 1).float(), -1)
    logp = torch.log_softmax(logits, -1)
    probs = logp.exp()
    l1 = (probs - teacher).abs().sum(-1)
    ce = F.cross_entropy(logits, labels, reduction="none")
    target_confidence = (1 - 0.5 * l1.detach()).clamp(0, 1)
    bce = F.binary_cross_entropy_with_logits(confidence, target_confidence, reduction="none")
    choice = row_argmax(teacher)
    label_prob = scatter_trained(probs.detach().gather(1, choice[:, None])[:, 0], plan)
    weights = position_weights(cfg, cfg.position_weights, trained, label_prob).flatten()[selected]
    total = weights.sum().clamp_min(1e-9)
    loss = (cfg.ce_weight * (ce * weights).sum() + cfg.l1_weight * (l1 * weights).sum()
            + cfg.confidence_weight * (bce * weights).sum()) / total
    hits = scatter_trained((row_argmax(logp) == choice).float(), plan)
    counts = trained.sum((0, 1)).clamp_min(1)
    metrics = {f"acc_{k}": hits[..., k].sum() / counts[k] for k in range(trained.shape[-1])}
    metrics["confidence_error"] = (torch.sigmoid(confidence.detach()) - target_confidence).abs(
        ).mean() if confidence.numel() else confidence.new_zeros(())
    return loss, metrics
