"""The draft vocabulary of a drafter whose head covers Vd of the target's V tokens (EAGLE-3's
convention, which DFlash's optional one follows): `d2t` (Vd,) offsets, draft id + d2t = target id;
`t2d` (V,) bool, the target tokens the head covers. Counted from the data (`draftsmith.data`)."""

from __future__ import annotations

import torch


class DraftVocab:
    """Mixin for an `nn.Module` drafter: the buffers, their installation and the draft ids."""

    def add_draft_vocab(self, draft_vocab_size: int, vocab_size: int) -> None:
        """Register the buffers, the identity map over the first Vd ids until one is installed."""
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(vocab_size, dtype=torch.bool))
        self.t2d[:draft_vocab_size] = True

    @property
    def reduced_vocab(self) -> bool:
        """Whether the head covers a draft vocabulary (the buffers exist)."""
        return hasattr(self, "d2t")

    def set_draft_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Install a draft vocabulary; sizes must match Vd and V.

        Raises:
            ValueError: a drafter without one, or other sizes.
        """
        if not self.reduced_vocab:
            raise ValueError("this drafter drafts over the whole vocabulary; set "
                             "drafter.draft_vocab_size to install a draft vocabulary")
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ValueError(f"draft vocab shapes d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)} "
                             f"do not match Vd={self.d2t.shape[0]} / V={self.t2d.shape[0]}")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_ids(self) -> torch.Tensor | None:
        """Target id of each draft id (Vd,), or None without a draft vocabulary."""
        if not self.reduced_vocab:
            return None
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t
