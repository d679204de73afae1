"""A drafter's draft vocabulary at the start of training: installed from the data's statistics,
or refused with the command that counts it."""

from __future__ import annotations

from draftsmith.errors import DraftsmithError


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
