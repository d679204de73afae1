"""Per-position draft losses and position weights, shared by every kind whose loss is per position
(EAGLE-1's token term, EAGLE-3's TTT steps, MTP modules, Medusa heads).

With p the target's distribution and q the draft's at one position (REFERENCE.md section 7.5):

- `kl`: soft cross-entropy -sum p log q: KL(p || q) plus the target's entropy, a constant, so the
  same gradients (draftsmith's loss before these options, kept bit for bit).
- `tv`: total variation 1 - alpha, alpha = sum_v min(p_v, q_v), the acceptance probability.
- `lk`: the LK lambda form (SpecForge `lk_loss_type="lambda"`): w = exp(-LK_DECAY * sg(mean
  alpha)) over the rows of one call (a TTT step, a head), then w * KL(p || q) + (1 - w)(1 - alpha)
  per row: KL while the draft rarely agrees, acceptance once it does.
- `ce`: cross-entropy on the target's argmax.

A loss setting is a name (`tv`) or a weighted mixture (`{ce: 0.1, tv: 0.9}`, speculators' JSON).
Position weights: `geometric` (the kind's own per-position weights), `decay` (exp(-k / gamma) for
draft position k = 0, 1, ...) or `dpace` (D-PACE: per sequence position, from the draft's
probability of the label at every depth; detached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOSSES = ("kl", "tv", "lk", "ce")
LABEL_SOURCES = ("target", "data")  # MTP / Medusa `labels`: the target's distribution or the data
POSITION_WEIGHTS = ("geometric", "decay", "dpace")
LK_DECAY = 1.0  # SpecForge's kl_decay (and kl_scale = 1)
DPACE_ALPHA = 0.5  # q~ = (1 - alpha) q + alpha (D-PACE, SP / SF / MO)


@dataclass(frozen=True)
class LossSpec:
    """A validated loss setting: (name, weight) terms, summed.

    Attributes:
        terms: e.g. (("kl", 1.0),) or (("ce", 0.1), ("tv", 0.9)).
    """

    terms: tuple[tuple[str, float], ...]

    @property
    def plain_kl(self) -> bool:
        return self.terms == (("kl", 1.0),)


def parse_loss(value, name: str = "drafter.loss") -> LossSpec:
    """A recipe's loss setting (a name or a {name: weight} mapping) as a LossSpec.

    Raises:
        ValueError: an unknown name, a weight that is not a number >= 0, or no positive weight;
            the message names the setting and the choices.
    """
    fix = (f"use one of {', '.join(LOSSES)}, or a mixture such as {{ce: 0.1, tv: 0.9}} "
           "(weights >= 0, summed)")
    if isinstance(value, str):
        value = {value: 1.0}
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{name}={value!r}: {fix}")
    terms = []
    for key, weight in value.items():
        if key not in LOSSES:
            raise ValueError(f"{name}: unknown loss {key!r}; {fix}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or \
                not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{name}: weight {weight!r} of {key!r} must be a number >= 0; {fix}")
        terms.append((key, float(weight)))
    if not any(weight > 0 for _, weight in terms):
        raise ValueError(f"{name}={value!r} gives every loss weight 0; {fix}")
    return LossSpec(tuple(terms))


def check_labels(labels: str, spec: LossSpec, name: str = "drafter") -> None:
    """`labels: data` trains cross-entropy on the data's tokens, so the loss setting must be the
    default. Raises ValueError naming both settings."""
    if labels not in LABEL_SOURCES:
        raise ValueError(f"{name}.labels={labels!r}: use one of {', '.join(LABEL_SOURCES)}")
    if labels == "data" and not spec.plain_kl:
        raise ValueError(f"{name}.labels=data trains cross-entropy on the data's tokens, so "
                         f"{name}.loss={dict(spec.terms)} has no target distribution to use; set "
                         f"{name}.labels=target, or leave {name}.loss at kl")


def check_position_weights(scheme: str, gamma: float, name: str = "drafter") -> None:
    """Raises ValueError for an unknown scheme or a gamma <= 0, naming the choices."""
    if scheme not in POSITION_WEIGHTS:
        raise ValueError(f"{name}.position_weights={scheme!r}: use one of "
                         f"{', '.join(POSITION_WEIGHTS)}")
    if not gamma > 0:
        raise ValueError(f"{name}.decay_gamma={gamma} must be > 0 (decay exp(-k / gamma))")


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in at least float32 (float64 stays float64): the dtype losses are computed in."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def row_argmax(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """`x.argmax(-1)` as `x.max(-1).indices`: the same index (the first maximum; a NaN counts as
    the maximum in both) at a third to a quarter of torch's CPU argmax cost on wide rows (2-core
    Xeon, torch 2.13: (1100, 8192) float32 2.8 against 11.4 ms, (1024, 49152) bfloat16 32 against
    83 ms); the training losses and the target's choice use it."""
    return x.max(-1, keepdim=keepdim).indices


def acceptance(draft_logp: torch.Tensor, target_p: torch.Tensor) -> torch.Tensor:
    """alpha = sum_v min(p_v, q_v) per row. (m, C), (m, C) -> (m,)"""
    return torch.minimum(draft_logp.exp(), target_p).sum(-1)


def per_row_loss(draft_logp: torch.Tensor, target_logits: torch.Tensor, spec: LossSpec,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """The loss of every row.

    Args:
        draft_logp: the draft's log-probabilities (..., C), float32 (or float64), with gradients.
        target_logits: the target's logits over the same C columns (..., C); its softmax is p
            and its argmax the `ce` label.
        spec: the loss setting.
        mask: (...) bool, the rows of the call that carry a loss (`lk`'s mean alpha is theirs);
            None = every row.

    Returns:
        (...) in draft_logp's dtype.
    """
    target_logits = wide(target_logits)
    p = torch.softmax(target_logits, dim=-1)
    total = draft_logp.new_zeros(draft_logp.shape[:-1])
    for name, weight in spec.terms:
        if name == "kl":
            term = -(p * draft_logp).sum(-1)
        elif name == "tv":
            term = 1 - acceptance(draft_logp, p)
        elif name == "ce":
            term = -draft_logp.gather(-1, row_argmax(target_logits, keepdim=True)).squeeze(-1)
        else:  # lk
            alpha = acceptance(draft_logp, p)
            mean = alpha.mean() if mask is None else \
                torch.where(mask, alpha, 0.0).sum() / mask.sum().clamp_min(1)
            w = torch.exp(-LK_DECAY * mean.detach())
            kl = (torch.xlogy(p, p) - p * draft_logp).sum(-1)
            term = w * kl + (1 - w) * (1 - alpha)
        total = total + weight * term
    return total


def summed_loss(draft_logp: torch.Tensor, target_logits: torch.Tensor, spec: LossSpec,
                row_weights: torch.Tensor | None = None) -> torch.Tensor:
    """sum over rows of (row weight *) `per_row_loss`; a scalar. Plain `kl` without row weights
    is computed as `-(p * log q).sum()` over the whole (m, C) block, as before these options."""
    if spec.plain_kl and row_weights is None:
        return -(torch.softmax(wide(target_logits), dim=-1) * draft_logp).sum()
    rows = per_row_loss(draft_logp, target_logits, spec)
    return (rows if row_weights is None else rows * row_weights).sum()


def label_prob(draft_logp: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """The draft's probability of the target's argmax, exp(-CE), detached. (m,)"""
    label = row_argmax(target_logits, keepdim=True)
    return draft_logp.detach().gather(-1, label).squeeze(-1).exp()


def decay_weights(count: int, gamma: float) -> list[float]:
    """exp(-k / gamma) for draft positions k = 0..count-1."""
    return [math.exp(-k / gamma) for k in range(count)]


def dpace_weights(q: torch.Tensor, mask: torch.Tensor, known: torch.Tensor | None = None,
                  alpha: float = DPACE_ALPHA) -> torch.Tensor:
    """D-PACE weights w_j = sum_{m >= j} C_m * mask_m, C_j = prod_{i <= j} q~_i, per sequence
    position (column), q~ = (1 - alpha) q + alpha where the depth's label is known and 1 where
    it is not (past the sequence, outside the loss mask).

    Args:
        q: (S, n) the draft's probability of the label at depth j (row) for position n.
        mask: (S, n) bool, depths that carry a loss.
        known: (S, n) bool, depths whose q counts; None = `mask`. A label the draft cannot
            propose (q = 0) is known without carrying a loss.
        alpha: D-PACE's floor (0.5).

    Returns:
        (S, n) weights in at least float32, detached.
    """
    q = wide(q.detach())
    known = mask if known is None else known
    q_tilde = torch.where(known, (1 - alpha) * q + alpha, torch.ones_like(q))
    cumulative = torch.cumprod(q_tilde, dim=0)
    carried = cumulative * mask.to(cumulative.dtype)
    return carried.flip(0).cumsum(0).flip(0)


class PositionLosses:
    """The weighted total of one call's per-position losses (kinds add each draft position's rows
    in order; local to one loss call).

    `geometric` and `decay` weight each position by a constant (`weights[k]`) times its mean loss;
    `dpace` weights each row by its D-PACE weight (needs every depth first, so `total` computes
    it at the end) over the same per-position count. `add_rows` takes a position's gathered rows
    with a mask of those that carry a loss (no host count); `add` takes selected rows and their
    flat positions.
    """

    def __init__(self, spec: LossSpec, scheme: str, weights: list[float], size: int,
                 device: torch.device):
        """Args:
            spec: the loss setting.
            scheme: `geometric` / `decay` (constant per position: `weights`) or `dpace`.
            weights: per-position constants (unused by `dpace`).
            size: flat (B * T) positions, the columns of D-PACE's grid.
        """
        self.spec, self.scheme, self.weights = spec, scheme, weights
        self.size, self.device = size, device
        self.sum = torch.zeros((), dtype=torch.float32, device=device)
        self.depths: list[tuple] = []  # dpace: (rows, count, mask, prob, missed) on the grid

    def add_rows(self, k: int, draft_logp: torch.Tensor, target_logits: torch.Tensor | None,
                 mask: torch.Tensor, flat: torch.Tensor, missed: torch.Tensor | None = None,
                 tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Draft position k's gathered rows, of which `mask` carry a loss; returns its
        (unweighted) mean loss over `mask`, detached.

        Args:
            draft_logp, target_logits: (m, C) as `per_row_loss` (target_logits unused with
                `tokens`).
            mask: (m,) bool, the rows that carry a loss; the divisor is their count, kept as a
                tensor. Other rows contribute neither loss nor gradient.
            flat: (m,) each row's flat (B * T) position (`dpace`'s column); rows in `mask` at
                distinct positions.
            missed: (m,) bool, trained rows whose label the draft cannot propose (out of
                EAGLE-3's draft vocabulary): q = 0 there (`dpace`).
            tokens: (m,) hard labels (`labels: data`), as in `add`.
        """
        count = mask.sum().clamp_min(1)
        if tokens is not None:
            rows = -draft_logp.gather(-1, tokens[:, None]).squeeze(-1)
            prob = (-rows).detach().exp()
        else:
            rows = per_row_loss(draft_logp, target_logits, self.spec, mask)
            prob = label_prob(draft_logp, target_logits) if self.scheme == "dpace" else None
        rows = torch.where(mask, rows, 0.0)
        step = rows.sum() / count
        if self.scheme != "dpace":
            self.sum = self.sum + self.weights[k] * step
            return step.detach()

        def grid(x):  # (m,) -> (B * T,): zero where no row of `mask` (or `missed`) lands
            return x.new_zeros(self.size).index_add(0, flat, x)

        def on_grid(m):
            return grid(m.to(rows.dtype)) > 0

        prob = torch.where(mask, prob, 0.0)
        known = on_grid(missed) if missed is not None else None
        self.depths.append((grid(rows), count, on_grid(mask), grid(prob), known))
        return step.detach()

    def add(self, k: int, draft_logp: torch.Tensor, target_logits: torch.Tensor,
            count: torch.Tensor, flat: torch.Tensor | None = None,
            missed: torch.Tensor | None = None, tokens: torch.Tensor | None = None
            ) -> torch.Tensor:
        """Draft position k's selected rows; returns its (unweighted) mean loss, detached.

        Args:
            draft_logp, target_logits: (m, C) as `per_row_loss`.
            count: the divisor (trained positions of depth k).
            flat: (m,) flat positions of the rows (`dpace`).
            missed: flat positions trained at depth k whose label the draft cannot propose (out
                of EAGLE-3's draft vocabulary): q = 0 there (`dpace`).
            tokens: (m,) hard labels (the data's tokens, `labels: data`): cross-entropy on them
                instead of the loss setting, which is then `kl` (see `check_labels`).
        """
        if tokens is not None:
            label = tokens[:, None]
            rows = -draft_logp.gather(-1, label).squeeze(-1)
            prob = draft_logp.detach().gather(-1, label).squeeze(-1).exp()
        if self.scheme != "dpace":
            if tokens is None:
                step = summed_loss(draft_logp, target_logits, self.spec) / count
            else:
                step = F.nll_loss(draft_logp, tokens, reduction="sum") / count
            self.sum = self.sum + self.weights[k] * step
            return step.detach()
        if tokens is None:
            rows = per_row_loss(draft_logp, target_logits, self.spec)
            prob = label_prob(draft_logp, target_logits)
        on_grid = torch.zeros(self.size, dtype=torch.bool, device=self.device)
        on_grid[flat] = True
        known = None
        if missed is not None:
            known = torch.zeros_like(on_grid)
            known[missed] = True
        self.depths.append((rows.new_zeros(self.size).index_copy(0, flat, rows), count, on_grid,
                            prob.new_zeros(self.size).index_copy(0, flat, prob), known))
        return (rows.sum() / count).detach()

    def total(self) -> torch.Tensor:
        """The weighted loss over every position added."""
        if self.scheme != "dpace" or not self.depths:
            return self.sum
        q = torch.stack([prob for _, _, _, prob, _ in self.depths])
        mask = torch.stack([on_grid for _, _, on_grid, _, _ in self.depths])
        known = torch.stack([on_grid if missed is None else on_grid | missed
                             for _, _, on_grid, _, missed in self.depths])
        weights = dpace_weights(q, mask, known)
        total = self.sum
        for j, (rows, count, _, _, _) in enumerate(self.depths):
            total = total + (weights[j] * rows).sum() / count
        return total
