"""Turning tokenized conversations into batches: held-out split, per-epoch plans, padding.

Three plans (`train.batching`): `tokens` (the default) groups sequences of similar length from a
shuffled pool into batches of about `train.batch_size x train.max_length` tokens each, so padding
stays a few percent and every step computes about as many tokens; `packed` puts sequences back to
back in rows of `train.max_length` (`train/packing.py`); `rows` pairs `train.batch_size`
sequences at random (right padding to the longest). On the quickstart's
conversations padding is 1.7% of the padded tokens against 26%
(benchmarks/train_step/loop-throughput.md). Either plan is a pure function of (seed, epoch), so
a resumed run reads exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence

import torch

from draftsmith.models.features import KIND_ROWS, NEXT_TRAINED_KEY
from draftsmith.models.layers import next_trained_rows
from draftsmith.train.packing import collate_packed, packed_batches

POOL_BATCHES = 64  # a pool holds this many batches' worth of sequences (padding vs. mixing)


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


def token_batches(lengths: Sequence[int], budget: int, pool: int, rng: random.Random,
                  min_rows: int = 1) -> list[list[int]]:
    """Length-bucketed batches of the indices of `lengths`: shuffled, cut into pools of `pool`,
    each pool sorted longest first and cut greedily so that `rows x longest <= budget` (a
    sequence longer than the budget goes alone), then the batches shuffled.

    Args:
        lengths: each sequence's length as it will be batched (already cut to max_length).
        budget: padded tokens per batch at most.
        pool: sequences sorted together (larger: less padding, less mixing of lengths).
        rng: the plan's generator (seeded by the caller: the plan is a function of it alone).
        min_rows: batches with fewer rows are left out (a pool's short tail, when a batch is
            split across `min_rows` processes).

    Returns:
        Lists of indices, one per batch, in training order.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    for start in range(0, len(order), pool):
        batch: list[int] = []
        for i in sorted(order[start:start + pool], key=lambda i: -lengths[i]):
            if batch and (len(batch) + 1) * lengths[batch[0]] > budget:
                batches.append(batch)
                batch = []
            batch.append(i)
        batches.append(batch)
    batches = [b for b in batches if len(b) >= min_rows]
    rng.shuffle(batches)
    return batches


def padding_share(lengths: Sequence[int], batches: list[list[int]]) -> float:
    """Share of the padded tokens of `batches` that are padding (right padding to the longest)."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    return 1 - real / padded if padded else 0.0


def collate_rows_of(recipe) -> Callable[..., dict[str, torch.Tensor]] | None:
    """The kind's rows made in the collate (registry `collate_rows`: EAGLE-3's packed rows,
    P-EAGLE's COD draw, the block drafters' blocks) bound to its drafter config and the run's
    seed, or None for a kind without them."""
    from draftsmith.registry import get_spec

    rows = get_spec(recipe.kind).collate_rows
    return None if rows is None else functools.partial(rows, recipe.drafter_config,
                                                       recipe.train.seed)


def collate(batch: list[dict], max_length: int, rows: Callable | None = None
            ) -> dict[str, torch.Tensor]:
    """Right-pad `input_ids` / `loss_mask` (and cached `hidden_states.i` rows, (T, H) each, their
    float8 row scales `hidden_states.i.scale`, (T,), and the cache's `target_argmax`, (T,)) to
    the longest sequence, capped at max_length; `NEXT_TRAINED_KEY` holds the flat positions whose
    next token is trained, counted here on the host so the step gathers its rows without a
    device read (`models/layers.next_trained_rows`); `rows` (`collate_rows_of`) adds a kind's own
    (`KIND_ROWS` keys)."""
    length = min(max(len(e["input_ids"]) for e in batch), max_length)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    loss_mask = torch.zeros(len(batch), length, dtype=torch.long)
    attention = torch.zeros(len(batch), length, dtype=torch.long)
    hidden_keys = [k for k in batch[0] if k.startswith("hidden_states.")]
    hidden = {k: torch.zeros(len(batch), length, *batch[0][k].shape[1:], dtype=batch[0][k].dtype)
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
    if rows is not None:
        hidden.update({KIND_ROWS + k: v for k, v in rows(ids, attention, loss_mask).items()})
    return {"input_ids": ids, "loss_mask": loss_mask, "attention_mask": attention,
            NEXT_TRAINED_KEY: next_trained_rows(loss_mask), **hidden}


class TaggedRows:
    """Examples looked up by (row, index) keys, returned as (row, example): how a DataLoader's
    flat batch of keys carries a packed batch's rows to `collate_tagged_rows`."""

    def __init__(self, examples: list[dict]):
        self.examples = examples

    def __getitem__(self, key: tuple[int, int]) -> tuple[int, dict]:
        row, index = key
        return row, self.examples[index]

    def __len__(self) -> int:
        return len(self.examples)


def collate_tagged_rows(tagged: list[tuple[int, dict]], max_length: int,
                        kind_rows: Callable | None = None) -> dict[str, torch.Tensor]:
    """`packing.collate_packed` of (row, example) pairs, in order."""
    rows: list[list[dict]] = []
    for row, example in tagged:
        while len(rows) <= row:
            rows.append([])
        rows[row].append(example)
    return collate_packed(rows, max_length, kind_rows)


class ExampleBatches:
    """In-memory examples as the loop reads its data (the interface `CacheStream` shares):
    a seeded held-out split, per-epoch batch plans whose global batch every process splits
    (process r takes rows r, r + W, ...: a W-process run trains on the batches a one-process
    run with W times the batch size does), `epoch_length(epoch)`, `train_batches(epoch, skip)`
    (a DataLoader with `train.loader_workers`, pinned memory on CUDA), `eval_batches()`,
    `num_eval_batches()` and `fingerprint()`.

    Raises:
        DraftsmithError: fewer training sequences than one global batch.
    """

    def __init__(self, examples: list[dict], cfg, accelerator, rows: Callable | None = None):
        from torch.utils.data import DataLoader

        from draftsmith.errors import DraftsmithError
        from draftsmith.train.resume import examples_record

        self.cfg, self.accelerator = cfg, accelerator
        self.collate = functools.partial(collate, max_length=cfg.max_length, rows=rows)
        self.collate_packed = functools.partial(collate_tagged_rows, max_length=cfg.max_length,
                                                kind_rows=rows)
        self.record = examples_record(examples)
        self.train_set, eval_set = split_examples(examples, cfg.eval_fraction, cfg.seed,
                                                  cfg.eval_max_samples)
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        self.lengths = [min(len(e["input_ids"]), cfg.max_length) for e in self.train_set]
        need = cfg.batch_size * self.world if cfg.batching == "rows" else self.world
        if len(self.train_set) < need:
            raise DraftsmithError(f"only {len(self.train_set)} training sequences for a global "
                                  f"batch of {need}: add data or lower train.batch_size")
        self.plan = functools.lru_cache(maxsize=2)(self._plan)
        # Each DataLoader gets its own generator: iterating one otherwise draws a seed from the
        # global RNG, so an evaluation or a resume mid-epoch would shift the training noise.
        self.eval_loader = accelerator.prepare(DataLoader(
            eval_set, batch_size=cfg.batch_size, generator=torch.Generator(),
            collate_fn=self.collate))

    def _plan(self, epoch: int) -> list[list[int]]:
        """This process's batches of `epoch` (indices into the training set)."""
        cfg, world = self.cfg, self.world
        if cfg.batching == "packed":
            rows = max(1, cfg.token_budget // cfg.max_length) * world
            rng = random.Random(f"{cfg.seed}:{epoch}:packed")
            return [b[self.rank::world] for b in packed_batches(
                self.lengths, cfg.max_length, rows, POOL_BATCHES * rows, rng, min_rows=world)]
        if cfg.batching == "tokens":
            budget = cfg.token_budget * world
            pool = POOL_BATCHES * max(1, budget // cfg.max_length)
            rng = random.Random(f"{cfg.seed}:{epoch}:tokens")
            return [b[self.rank::world] for b in token_batches(self.lengths, budget, pool, rng,
                                                                 min_rows=world)]
        order, rows = epoch_order(len(self.train_set), cfg.seed, epoch), cfg.batch_size
        return [order[start + self.rank * rows: start + (self.rank + 1) * rows]
                for start in range(0, len(order) - rows * world + 1, rows * world)]

    def _loader(self, rows: list[dict], plan: list, workers: int):
        from torch.utils.data import DataLoader

        collate_fn = self.collate
        if self.cfg.batching == "packed":  # keys (row in batch, example): the collate regroups
            rows, collate_fn = TaggedRows(rows), self.collate_packed
            plan = [[(r, i) for r, row in enumerate(batch) for i in row] for batch in plan]
        return DataLoader(rows, batch_sampler=plan, num_workers=workers,
                          collate_fn=collate_fn,
                          pin_memory=torch.cuda.is_available(),
                          prefetch_factor=2 if workers else None, generator=torch.Generator())

    def epoch_length(self, epoch: int) -> int:
        """Batches each process takes in `epoch` (the same on every process)."""
        return len(self.plan(epoch))

    def train_batches(self, epoch: int, skip: int = 0, *, float8: bool = False):
        """This process's batches of `epoch` after the first `skip` (exact resume), on the CPU
        (`float8` is the interface `CacheStream` shares: these batches hold none)."""
        return iter(self._loader(self.train_set, self.plan(epoch)[skip:],
                                 self.cfg.workers))

    def eval_batches(self):
        return self.eval_loader

    def num_eval_batches(self) -> int:
        return len(self.eval_loader)

    def fingerprint(self) -> dict:
        return self.record
