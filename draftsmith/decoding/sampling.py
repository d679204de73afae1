"""Turning logits into the distribution a decoder samples from (temperature, top-p)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen. temperature 0 means greedy.

    Attributes:
        temperature: softmax temperature; 0 selects greedy decoding.
        top_p: nucleus mass kept (1.0 keeps everything).
        seed: seed of the generator used for accept/reject and sampling.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Probabilities after temperature and top-p, computed in float32. (..., V) -> (..., V)"""
    probs = torch.softmax(logits.float() / max(config.temperature, 1e-6), dim=-1)
    if config.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= config.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_token(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token drawn from `probs` (V,), as a (1,) long tensor on `probs`' device.

    The uniform comes from `generator` (a CPU generator, so a seed gives the same draws on any
    device) and the inverse CDF runs where `probs` lives: no host read, no copy of `probs`.
    """
    u = torch.rand(1, generator=generator, dtype=torch.float64,
                   device=generator.device if generator is not None else "cpu")
    cdf = probs.double().cumsum(-1)
    index = torch.searchsorted(cdf, u.to(probs.device) * cdf[-1], right=True)
    return index.clamp(max=probs.shape[-1] - 1)


def choose_token(logits: torch.Tensor, config: SamplingConfig,
                 generator: torch.Generator | None = None) -> int:
    """The target's own choice from one position's logits (V,): the argmax when greedy, else a
    draw from the tempered, top-p distribution (what verification's bonus token is)."""
    if config.greedy:
        return int(logits.argmax(-1))
    return int(sample_token(logits_to_probs(logits, config), generator))
