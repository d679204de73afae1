"""Turning tokenized conversations into batches: held-out split, per-epoch order, padding."""

from __future__ import annotations

import random

import torch


def split_examples(examples: list[dict], eval_fraction: float, seed: int
                   ) -> tuple[list[dict], list[dict]]:
    """Deterministic (train, held-out) split; at least one held-out example when asked for."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_eval = max(1, round(len(examples) * eval_fraction)) if eval_fraction > 0 else 0
    held = set(order[:n_eval])
    return ([e for i, e in enumerate(examples) if i not in held],
            [e for i, e in enumerate(examples) if i in held])


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The shuffled order of one epoch, reproducible from (seed, epoch) alone (exact resume)."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def collate(batch: list[dict], max_length: int) -> dict[str, torch.Tensor]:
    """Right-pad `input_ids` / `loss_mask` (and cached `hidden_states.i` rows, (T, H) each, and
    the cache's `target_argmax`, (T,)) to the longest sequence, capped at max_length."""
    length = min(max(len(e["input_ids"]) for e in batch), max_length)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    loss_mask = torch.zeros(len(batch), length, dtype=torch.long)
    attention = torch.zeros(len(batch), length, dtype=torch.long)
    hidden_keys = [k for k in batch[0] if k.startswith("hidden_states.")]
    hidden = {k: torch.zeros(len(batch), length, batch[0][k].shape[-1], dtype=batch[0][k].dtype)
              for k in hidden_keys}
    for row, example in enumerate(batch):
        n = min(len(example["input_ids"]), length)
        ids[row, :n] = torch.as_tensor(example["input_ids"][:n])
        loss_mask[row, :n] = torch.as_tensor(example["loss_mask"][:n])
        attention[row, :n] = 1
        for key in hidden_keys:
            hidden[key][row, :n] = example[key][:n]
    if "target_argmax" in batch[0]:
        choice = torch.zeros(len(batch), length, dtype=torch.long)
        for row, example in enumerate(batch):
            n = min(len(example["target_argmax"]), length)
            choice[row, :n] = example["target_argmax"][:n].long()
        hidden["target_argmax"] = choice
    return {"input_ids": ids, "loss_mask": loss_mask, "attention_mask": attention, **hidden}
