"""Packed batches (`train.batching: packed`): several conversations back to back in each row of
`train.max_length` tokens, so a step computes `batch_tokens` tokens of which almost none is
padding, in the same (rows, max_length) shape every step.

A packed batch carries two more (B, T) tensors: `document_ids` (1, 2, ... for the documents of a
row in order, 0 on padding) and `position_ids` (each document's own positions from 0). The target
and the drafter attend only within a document (`models/layers.document_causal_mask`) at those
positions, and a loss trains a position only on labels of its own document, so the losses and
gradients are those of the same conversations in their own rows (tests/train/test_packing.py
holds that in float64). Each document's first token gets loss weight 0: in its own row nothing
precedes it, so no position is trained to predict it there either.

Every kind's loss knows documents (the target's forward, the drafters' attention and the block
drafters' context by mask and positions; labels, P-EAGLE's COD draw and the block drafters'
anchors per document); a kind says so in the registry (`DrafterSpec.packs`), and the recipe
refuses `packed` for one that does not.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from draftsmith.models.features import DOCUMENTS_KEY, KIND_ROWS, NEXT_TRAINED_KEY, POSITIONS_KEY
from draftsmith.models.layers import next_trained_rows


def pack_rows(lengths: Sequence[int], row_length: int, pool: int, rng: random.Random
              ) -> list[list[int]]:
    """Rows of indices of `lengths`, each summing to at most `row_length`: shuffled, cut into
    pools of `pool`, each pool packed first-fit decreasing (longest first into the first row with
    room), then the rows shuffled. A pure function of `rng`'s state (exact resume).

    Args:
        lengths: each sequence's length as it will be batched (already cut to row_length).
        row_length: tokens per row.
        pool: sequences packed together (larger: fuller rows, less mixing).
        rng: the plan's generator.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    rows: list[list[int]] = []
    for start in range(0, len(order), pool):
        room: list[int] = []
        packed: list[list[int]] = []
        for i in sorted(order[start:start + pool], key=lambda i: -lengths[i]):
            slot = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
            if slot is None:
                room.append(row_length)
                packed.append([])
                slot = len(room) - 1
            room[slot] -= lengths[i]
            packed[slot].append(i)
        rows += packed
    rng.shuffle(rows)
    return rows


def packed_batches(lengths: Sequence[int], row_length: int, rows_per_batch: int, pool: int,
                   rng: random.Random, min_rows: int = 1) -> list[list[list[int]]]:
    """`pack_rows` grouped `rows_per_batch` rows a batch (each a list of rows of indices); a last
    batch with fewer than `min_rows` rows (one per process) is left out."""
    rows = pack_rows(lengths, row_length, pool, rng)
    batches = [rows[s:s + rows_per_batch] for s in range(0, len(rows), rows_per_batch)]
    return [b for b in batches if len(b) >= min_rows]


def packing_share(lengths: Sequence[int], batches: list[list[list[int]]]) -> float:
    """Share of the tokens the step computes that are padding (rows right-padded to the
    batch's fullest row)."""
    real = sum(lengths[i] for b in batches for row in b for i in row)
    computed = sum(len(b) * max(sum(lengths[i] for i in row) for row in b) for b in batches)
    return 1 - real / computed if computed else 0.0


def collate_packed(rows: list[list[dict]], max_length: int, kind_rows: Callable | None = None
                   ) -> dict[str, torch.Tensor]:
    """A packed batch: each row's examples back to back, right-padded to the fullest row (capped
    at max_length); the keys `batching.collate` makes, plus `document_ids` and `position_ids`
    (module docstring). `kind_rows` gets the documents too (`documents=`)."""
    fill = [min(sum(len(e["input_ids"]) for e in row), max_length) for row in rows]
    b, t = len(rows), max(fill)
    first = rows[0][0]
    ids = torch.zeros(b, t, dtype=torch.long)
    loss_mask = torch.zeros(b, t, dtype=torch.long)
    attention = torch.zeros(b, t, dtype=torch.long)
    documents = torch.zeros(b, t, dtype=torch.long)
    positions = torch.zeros(b, t, dtype=torch.long)
    hidden_keys = [k for k in first if k.startswith("hidden_states.")]
    hidden = {k: torch.zeros(b, t, *first[k].shape[1:], dtype=first[k].dtype)
              for k in hidden_keys}
    choice = torch.zeros(b, t, dtype=torch.long) if "target_argmax" in first else None
    for r, row in enumerate(rows):
        start = 0
        for d, example in enumerate(row, start=1):
            n = min(len(example["input_ids"]), t - start)
            if n <= 0:
                break
            span = slice(start, start + n)
            ids[r, span] = torch.as_tensor(example["input_ids"][:n])
            loss_mask[r, span] = torch.as_tensor(example["loss_mask"][:n])
            loss_mask[r, start] = 0  # nothing before it in its own row predicts it
            attention[r, span] = 1
            documents[r, span] = d
            positions[r, span] = torch.arange(n)
            for key in hidden_keys:
                hidden[key][r, span] = example[key][:n]
            if choice is not None:
                choice[r, span] = example["target_argmax"][:n].long()
            start += n
    if choice is not None:
        hidden["target_argmax"] = choice
    if kind_rows is not None:
        hidden.update({KIND_ROWS + k: v for k, v in
                       kind_rows(ids, attention, loss_mask, documents=documents).items()})
    return {"input_ids": ids, "loss_mask": loss_mask, "attention_mask": attention,
            DOCUMENTS_KEY: documents, POSITIONS_KEY: positions,
            NEXT_TRAINED_KEY: next_trained_rows(loss_mask), **hidden}
