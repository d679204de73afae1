"""The drafter's side of the draft vocabulary: the buffers mixin EAGLE-3 and DFlash share
(`d2t` (Vd,) offsets, draft id + d2t = target id; `t2d` (V,) bool, the target tokens the head
covers), installing the data's vocabulary before training, and the error when the data has none."""

from __future__ import annotations

import torch

from draftsmith.errors import DraftsmithError


class DraftVocabMixin:
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


def install_draft_vocab(drafter, vocab, target_vocab_size: int) -> None:
    """Give an EAGLE-3 or DFlash drafter the data's draft vocabulary (before its head is
    initialised); a DFlash drafter without `draft_vocab_size` drafts over every token and ignores it.

    Raises:
        DraftsmithError: no vocabulary while the drafter drafts over fewer tokens than the target
            has (its first Vd ids would be arbitrary tokens), or one of another size.
    """
    if drafter.config.draft_vocab_size is None:
        return
    if vocab is None:
        if drafter.draft_vocab_size < target_vocab_size:
            raise DraftsmithError(missing_draft_vocab(drafter.draft_vocab_size, target_vocab_size))
        return
    if vocab.d2t.numel() != drafter.draft_vocab_size:
        raise DraftsmithError(
            f"data.draft_vocab_size={vocab.d2t.numel()} differs from drafter.draft_vocab_size="
            f"{drafter.draft_vocab_size}; set both to the same value")
    drafter.set_draft_vocab(vocab.d2t, vocab.t2d)


def missing_draft_vocab(draft_vocab_size: int, target_vocab_size: int,
                        tokenized: bool = False) -> str:
    """The error for a reduced draft vocabulary that the data does not provide."""
    counts = "counts the most frequent trained tokens into DATA_OUT_DIR/draft_vocab.safetensors"
    if tokenized:
        fix = ("pre-tokenized data (data.tokenized) carries none; prepare the data with "
               f"`draftsmith data run --config DATA_RECIPE` (see recipes/data/) and "
               f"data.draft_vocab_size: {draft_vocab_size}, which {counts}, and train from that "
               "data section instead")
    else:
        fix = (f"the recipe builds none; add `draft_vocab_size: {draft_vocab_size}` to its data "
               "section, so that the data pipeline (`draftsmith data run`, which `draftsmith "
               f"train` runs first) {counts}")
    return (f"drafter.draft_vocab_size={draft_vocab_size} of the target's {target_vocab_size:,} "
            f"tokens needs a draft vocabulary (which tokens the drafter proposes), but {fix}; or "
            f"set drafter.draft_vocab_size: {target_vocab_size} to draft over every token")
