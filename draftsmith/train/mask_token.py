"""A block drafter's mask token (DFlash, DSpark `drafter.mask_token_id`) fills the block after
its anchor, so it must be a token the data never holds (README): counted in the training data
when a run starts, with a warning naming how often and where it ranks among the data's tokens."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def mask_token_warning(mask_token_id: int, rows: Iterable[list[int]], vocab_size: int,
                       chosen: bool = True) -> str | None:
    """A warning when `mask_token_id` occurs in the token rows, else None.

    Args:
        mask_token_id: the id the drafter masks with (resolved: `resolve_mask_token`).
        rows: the training sequences' input ids.
        vocab_size: the target's vocabulary size (ids are counted in [0, vocab_size)).
        chosen: the recipe named it (False: it fell back on the target config's mask, eos or
            pad token).
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    holding = total = 0
    for ids in rows:
        row = torch.as_tensor(ids, dtype=torch.long)
        row = row[(row >= 0) & (row < vocab_size)]
        counts += torch.bincount(row, minlength=vocab_size)
        holding += int((row == mask_token_id).any())
        total += 1
    count = int(counts[mask_token_id])
    if not count:
        return None
    rank = int((counts > count).sum()) + 1
    where = "the data's most frequent token" if rank == 1 else \
        f"the data's {_ordinal(rank)} most frequent token"
    origin = "" if chosen else " (not set: the target config's mask, eos or pad token)"
    share = count / max(int(counts.sum()), 1)
    return (f"warning: drafter.mask_token_id={mask_token_id}{origin} occurs {count:,} times in "
            f"{holding:,} of {total:,} training sequences ({share:.1%} of their tokens, {where}); "
            "the mask token must be one the data never holds, or the drafter cannot tell a masked "
            "slot from that token: set drafter.mask_token_id to an unused or reserved token of "
            "the tokenizer (the SmolLM2 recipes use <empty_output>, 16)")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"


def warn_if_mask_token_in_data(drafter_config, target_config, rows: Iterable[list[int]],
                               log) -> None:
    """`log` the warning of `mask_token_warning` for a drafter with a mask token (a config with a
    `mask_token_id` field); nothing for other kinds or when the data never holds it."""
    from draftsmith.models.dflash import resolve_mask_token

    if not hasattr(drafter_config, "mask_token_id"):
        return
    chosen = drafter_config.mask_token_id
    vocab_size = int(target_config.get_text_config().vocab_size)
    warning = mask_token_warning(resolve_mask_token(target_config, chosen), rows, vocab_size,
                                 chosen is not None)
    if warning is not None:
        log(warning)
