"""A draft vocabulary as a value, chosen from token counts: the Vd most frequent ids.

Ties in frequency go to the lower token id, and when fewer than Vd tokens were seen the rest are
the lowest unseen ids, so the result is deterministic. Coverage is the share of the counted tokens
(the loss-masked target tokens) inside the draft vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.errors import DraftsmithError


@dataclass(frozen=True)
class DraftVocab:
    """A draft vocabulary. d2t: int64 (Vd,); t2d: bool (V,); coverage in [0, 1]."""

    d2t: torch.Tensor
    t2d: torch.Tensor
    coverage: float

    @property
    def draft_to_target(self) -> torch.Tensor:
        """Target id of every draft id. (Vd,) int64"""
        return torch.arange(self.d2t.numel(), dtype=torch.int64) + self.d2t

    def summary(self) -> str:
        return (f"draft vocabulary {self.d2t.numel():,} of {self.t2d.numel():,} tokens covers "
                f"{100 * self.coverage:.2f}% of the loss-masked target tokens")


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """The `draft_vocab_size` most frequent ids of `counts` (V,) as d2t/t2d.

    Raises:
        DraftsmithError: Vd is not in [1, V], or no token was counted.
    """
    vocab_size = counts.numel()
    if not 1 <= draft_vocab_size <= vocab_size:
        raise DraftsmithError(
            f"data.draft_vocab_size = {draft_vocab_size} must be between 1 and the target "
            f"vocabulary size {vocab_size}"
        )
    total = int(counts.sum())
    if total == 0:
        raise DraftsmithError("no loss-masked tokens were counted, so a draft vocabulary cannot "
                              "be chosen; check that the data has assistant turns")
    ids = torch.arange(vocab_size, dtype=torch.int64)
    # stable sort by count descending keeps ties in ascending id order
    by_frequency = ids[torch.sort(-counts.to(torch.int64), stable=True).indices]
    used = torch.sort(by_frequency[:draft_vocab_size]).values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    d2t = used - torch.arange(draft_vocab_size, dtype=torch.int64)
    return DraftVocab(d2t=d2t, t2d=t2d, coverage=int(counts[used].sum()) / total)
