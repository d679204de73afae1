"""Right-padded batches of variable-length samples, shared by the online and the offline readers.

A sample is a dict of tensors whose first dimension is the sequence: `input_ids` (T,),
`loss_mask` (T,) and optionally `hidden_states.{i}` (T, H). A batch adds `attention_mask`
(1 on real tokens) and pads every key on the right with zeros. Right padding leaves the hidden
states of real tokens unchanged under causal attention.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import torch

from draftsmith.data.render import RenderedSample


def collate(samples: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad samples to the longest one. Returns (B, T) ids/masks and (B, T, H) features."""
    lengths = [int(s["input_ids"].shape[0]) for s in samples]
    width = max(lengths)
    batch = {}
    for key, first in samples[0].items():
        out = first.new_zeros((len(samples), width, *first.shape[1:]))
        for row, sample in enumerate(samples):
            out[row, : lengths[row]] = sample[key]
        batch[key] = out
    batch["attention_mask"] = torch.zeros((len(samples), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        batch["attention_mask"][row, :length] = 1
    return batch


def plan_batches(
    lengths: Sequence[int], batch_size: int, batch_tokens: int, extra_tokens: int = 0
) -> list[list[int]]:
    """Group sample indices, longest first, into batches of at most `batch_size` rows whose padded
    size `rows * (longest + extra_tokens)` stays within `batch_tokens` (a longer sample goes alone).

    Sorting by length keeps padding small; the token budget keeps long prompts from being padded
    and attended in large batches, which on a CPU costs far more than the short ones save.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches:
            batch = batches[-1]
            width = lengths[batch[0]] + extra_tokens
            if len(batch) < batch_size and (len(batch) + 1) * width <= batch_tokens:
                batch.append(i)
                continue
        batches.append([i])
    return batches


def sample_tensors(sample: RenderedSample) -> dict[str, torch.Tensor]:
    """A rendered sample as tensors: `input_ids` and `loss_mask`, int64. (T,), (T,)"""
    return {"input_ids": torch.tensor(sample.input_ids, dtype=torch.long),
            "loss_mask": torch.tensor(sample.loss_mask, dtype=torch.long)}


def iter_token_batches(
    samples: Sequence[RenderedSample], batch_size: int, *, shuffle: bool = False, seed: int = 0,
    rank: int = 0, world_size: int = 1,
) -> Iterator[dict[str, torch.Tensor]]:
    """Padded batches of rendered samples for online feature extraction during training.

    Samples go round-robin to ranks (`rank`, `world_size`) after an optional seeded shuffle that
    every rank computes identically, so ranks see disjoint samples.
    """
    order = list(range(len(samples)))
    if shuffle:
        random.Random(seed).shuffle(order)
    mine = order[rank::world_size]
    for start in range(0, len(mine), batch_size):
        yield collate([sample_tensors(samples[i]) for i in mine[start: start + batch_size]])
