"""A chi-square goodness-of-fit test of sampled first tokens against the target's exact distribution.

Draws are tuples of the first one or two generated tokens. The bins are fixed by the target's
distribution alone, before the draws are looked at: each first token x1 expected at least
`min_expected` times gets its own bins, split by second token x2 where (x1, x2) is expected that
often (the rest of x1's mass is one more bin), and everything rarer is pooled (joining the least likely
bin when the pool is rarer still). With every bin expected at least `min_expected` times, Pearson's statistic follows a chi-square distribution with
(bins - 1) degrees of freedom closely, so under a lossless sampler the p-value is close to uniform
and a test at level a fails falsely with probability close to a.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

MIN_EXPECTED = 5.0
REST = ("rest",)


@dataclass
class FitResult:
    """Outcome of one test: statistic, degrees of freedom, p-value, and draws the target could not
    produce (a token of zero probability: a failure whatever the p-value)."""

    statistic: float
    dof: int
    p_value: float
    impossible: int

    def passed(self, level: float) -> bool:
        return self.impossible == 0 and self.p_value >= level


def chi_square_p_value(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularized upper incomplete gamma function."""
    if dof < 1:
        return 1.0
    a = torch.tensor(dof / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(statistic / 2, dtype=torch.float64)))


def first_token_bins(p1: torch.Tensor, p2: dict[int, torch.Tensor], samples: int,
                     eos: set[int] = frozenset(), min_expected: float = MIN_EXPECTED
                     ) -> tuple[dict[tuple, float], tuple]:
    """Bins with their probabilities (summing to 1): `(x1,)`, `(x1, x2)`, `(x1, "rest")` for the
    rest of x1's mass, and `REST` for everything rarer; and the bin that rarer draws fall in.

    Args:
        p1: (V,) the target's distribution of the first token.
        p2: x1 -> (V,) its distribution of the second token after x1, for every x1 with
            samples * p1[x1] >= min_expected that is not an EOS token (other x1 are not split).
        samples: number of draws the bins are for.
        eos: tokens that end generation (a draw starting with one has no second token).
        min_expected: the least expected count of a bin; rarer mass is pooled in `REST`, which
            joins the least likely bin when it is itself rarer.
    """
    bins: dict[tuple, float] = {}
    pooled = 0.0
    for x1, p in enumerate(p1.double().tolist()):
        if samples * p < min_expected:
            pooled += p
        elif x1 in eos or x1 not in p2:
            bins[(x1,)] = p
        else:
            rest = p
            for x2, q in enumerate(p2[x1].double().tolist()):
                if samples * p * q >= min_expected:
                    bins[(x1, x2)] = p * q
                    rest -= p * q
            if samples * rest >= min_expected:
                bins[(x1, "rest")] = rest
            else:
                pooled += max(rest, 0.0)
    if samples * pooled >= min_expected or not bins:
        bins[REST] = pooled
        return bins, REST
    smallest = min(bins, key=bins.get)
    bins[smallest] += pooled
    return bins, smallest


def bin_of(draw: tuple[int, ...], bins: dict[tuple, float], rest: tuple = REST) -> tuple:
    """The bin of `first_token_bins` a draw falls in (`rest`: where rare draws go)."""
    for key in (draw[:2], draw[:1], (draw[0], "rest")):
        if key in bins:
            return key
    return rest


def fit_first_tokens(draws: list[tuple[int, ...]], p1: torch.Tensor, p2: dict[int, torch.Tensor],
                     eos: set[int] = frozenset(), min_expected: float = MIN_EXPECTED) -> FitResult:
    """Pearson's chi-square test of the draws' first tokens against p1 (and p2 after x1).

    Args:
        draws: per sample, its first generated tokens (two, or one that is an EOS token).
        p1, p2, eos, min_expected: as `first_token_bins`.
    """
    samples = len(draws)
    bins, rest = first_token_bins(p1, p2, samples, eos, min_expected)
    impossible = sum(1 for d in draws if float(p1[d[0]]) == 0.0
                     or (len(d) > 1 and d[0] in p2 and float(p2[d[0]][d[1]]) == 0.0))
    counts = Counter(bin_of(d, bins, rest) for d in draws)
    cells = [(counts.get(key, 0), p * samples) for key, p in bins.items() if p > 0]
    statistic = sum((observed - expected) ** 2 / expected for observed, expected in cells)
    dof = len(cells) - 1
    return FitResult(statistic, dof, chi_square_p_value(statistic, dof), impossible)
