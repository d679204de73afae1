"""Turning tokenized conversations into batches: held-out split, per-epoch order, padding."""

from __future__ import annotations

import random

import torch


def split_examples(examples: list[dict], eval_fraction: float, seed: int,
                   max_held: int | None = None) -> tuple[list[dict], list[dict]]:
    """Deterministic (train, held-out) split; at least one held-out example when asked for, at
    most `max_held` (None = no cap)."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_eval = max(1, round(len(examples) * eval_fraction)) if eval_fraction > 0 else 0
    n_eval = min(n_eval, max_held) if max_held is not None else n_eval
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


class ExampleBatches:
    """In-memory examples as the loop reads its data (the interface `CacheStream` shares):
    a seeded held-out split, per-epoch shuffled batches split across processes by accelerate,
    `batches_per_epoch`, `train_batches(epoch, skip)`, `eval_batches()`, `num_eval_batches()`
    and `fingerprint()`.

    Raises:
        DraftsmithError: fewer training sequences than one global batch.
    """

    def __init__(self, examples: list[dict], cfg, accelerator):
        from draftsmith.errors import DraftsmithError
        from draftsmith.train.resume import examples_record

        self.cfg, self.accelerator = cfg, accelerator
        self.record = examples_record(examples)
        self.train_set, eval_set = split_examples(examples, cfg.eval_fraction, cfg.seed,
                                                     cfg.eval_max_samples)
        world = cfg.batch_size * accelerator.num_processes
        if len(self.train_set) < world:
            raise DraftsmithError(f"only {len(self.train_set)} training sequences for a global "
                                  f"batch of {world}: add data or lower train.batch_size")
        self.batches_per_epoch = len(self.train_set) // world
        # Each DataLoader gets its own generator: iterating one otherwise draws a seed from the
        # global RNG, so an evaluation or a resume mid-epoch would shift the training noise.
        self.eval_loader = accelerator.prepare(self._loader(eval_set, drop_last=False))

    def _loader(self, rows: list[dict], drop_last: bool):
        from torch.utils.data import DataLoader

        return DataLoader(rows, batch_size=self.cfg.batch_size, drop_last=drop_last,
                          collate_fn=lambda b: collate(b, self.cfg.max_length),
                          generator=torch.Generator())

    def train_batches(self, epoch: int, skip: int = 0):
        order = epoch_order(len(self.train_set), self.cfg.seed, epoch)
        loader = self.accelerator.prepare(self._loader([self.train_set[i] for i in order], True))
        return self.accelerator.skip_first_batches(loader, skip) if skip else loader

    def eval_batches(self):
        return self.eval_loader

    def num_eval_batches(self) -> int:
        return len(self.eval_loader)

    def fingerprint(self) -> dict:
        return self.record
