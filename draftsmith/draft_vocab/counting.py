"""Counting a draft vocabulary from the data: how often each token id is trained on, or how often
the target itself chooses it (stored by the hidden-state cache), and the data pipeline's step that
counts, chooses the Vd most frequent and saves `draft_vocab.safetensors`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open

from draftsmith.draft_vocab.file import save_draft_vocab
from draftsmith.draft_vocab.vocab import build_draft_vocab


class MaskedTokens(Protocol):
    """One rendered sample (`draftsmith.data.render.RenderedSample`): its ids and loss mask."""

    input_ids: Sequence[int]
    loss_mask: Sequence[int]


def token_counts(samples: Iterable[MaskedTokens], vocab_size: int) -> torch.Tensor:
    """How often each token id occurs where the loss mask is 1. (V,) int64"""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for sample in samples:
        ids = torch.tensor(sample.input_ids, dtype=torch.long)
        mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def target_choice_counts(shard_files: Sequence[Path], vocab_size: int) -> torch.Tensor | None:
    """How often the target itself chooses each id (V,) where the next token is trained: its
    greedy choice after every token, stored by the hidden-state cache's shards (`target_argmax`).

    None without shards, or when a shard lacks it (a cache written before draftsmith recorded it).
    """
    if not shard_files:
        return None
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for shard in shard_files:
        with safe_open(str(shard), framework="pt") as handle:
            if "target_argmax" not in handle.keys():  # noqa: SIM118 (safe_open has no __contains__)
                return None
            choice = handle.get_tensor("target_argmax").to(torch.int64)
            mask = handle.get_tensor("loss_mask").bool()
            lengths = handle.get_tensor("lengths")
        ends = torch.cumsum(lengths, 0) - 1  # the last token of each sample predicts nothing here
        trained_next = torch.cat([mask[1:], mask.new_zeros(1)])
        trained_next[ends] = False
        counts += torch.bincount(choice[trained_next], minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocab_step(size: int, vocab_size: int, samples: Iterable[MaskedTokens],
                     cache_shards: Sequence[Path], out_dir: Path,
                     log: Callable[[str], None]) -> dict:
    """The data pipeline's step: the `size` most frequent of the target's `vocab_size` tokens,
    counted from the target's own choices on the cached conversations (`cache_shards`, the
    finished cache's shard files, when they hold them) else from the data's tokens, saved as
    `out_dir/draft_vocab.safetensors`.

    Returns:
        the summary's `draft_vocab` section.
    """
    counts = target_choice_counts(cache_shards, vocab_size)
    source = "the target's own choices on the cached conversations"
    if counts is None or not int(counts.sum()):
        counts, source = token_counts(samples, vocab_size), "the data's tokens"
    vocab = build_draft_vocab(counts, size)
    path = save_draft_vocab(vocab, out_dir / "draft_vocab.safetensors")
    log(f"{vocab.summary()} (counted from {source}); saved {path}")
    return {"path": str(path), "size": size, "coverage": round(vocab.coverage, 6),
            "counted_from": source}
