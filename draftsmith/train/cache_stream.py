"""Training data streamed from the offline hidden-state cache, so that host memory does not grow
with the cache: each rank reads its own shards, a window of shards at a time, shuffled within the
window, and resumes exactly from (epoch, batches done) without reading what it skips.

The held-out set is a seeded hash of each sample's position in the data (`held_out`), the same on
every rank and in every epoch. The shards are dealt to the ranks once (a seeded shuffle, then
every W-th); in epoch e rank r reads its shards in an order seeded by (seed, e, r), `window`
shards at a time, each window's samples in a seeded random order, batched as `train.batching`
says (`tokens`: length-bucketed within the window, `train/batching.py`). Every rank stops an
epoch after the same number of batches (the most the rank with the fewest fills), so DDP ranks
stay in step. Only the shards' sample lengths are read to plan all this (at the start); a
sample's tensors are read from the memory-mapped shard when its batch is built.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from draftsmith.data.cache_reader import FeatureCache
from draftsmith.errors import DraftsmithError
from draftsmith.train.batching import POOL_BATCHES, collate, token_batches
from draftsmith.train.packing import collate_packed, packed_batches

_MASK32 = 0xFFFFFFFF


def held_out(positions: torch.Tensor, seed: int, fraction: float) -> torch.Tensor:
    """Whether each sample position (int64) is held out: a 32-bit mix of (position, seed) below
    `fraction` of its range. Deterministic, independent of shards, ranks and epochs. (n,) bool"""
    x = (positions * 0x9E3779B1 + (seed + 1) * 0x7FEB352D) & _MASK32
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & _MASK32
    x = ((x ^ (x >> 12)) * 0x297A2D39) & _MASK32
    x = x ^ (x >> 15)
    return x < int(fraction * 2 ** 32)


@dataclass
class _Shard:
    entry: dict  # the manifest's record
    train: list[int]  # indices (in the shard) of training samples
    held: list[int]  # and of held-out samples


class CacheStream:
    """Batches of a `FeatureCache` for one rank (see the module docstring).

    Args:
        cache: the opened cache.
        keys, extras: hidden-state keys to read, and per-token extras where stored.
        batch_size, max_length: per-rank batch rows; tokens per row (longer samples are cut).
        batching, batch_tokens: `tokens` (length-bucketed batches of batch_tokens padded tokens,
            default batch_size x max_length), `packed` (batch_tokens // max_length packed rows,
            `train/packing.py`) or `rows` (batch_size samples each).
        seed, eval_fraction: shuffling and the held-out share (at least one sample when > 0).
        max_held: at most this many held out, the first in data order (None = no cap).
        rank, world_size: this process among all.
        window: shards shuffled together; host memory holds at most this many mapped shards.
        rows: a kind's rows drawn by the collate (`batching.collate_rows_of`), or None.

    Raises:
        DraftsmithError: fewer shards than processes, or too few samples for a batch per rank.
    """

    def __init__(self, cache: FeatureCache, keys: list[str], extras: tuple[str, ...], *,
                 batch_size: int, max_length: int, seed: int, eval_fraction: float, rank: int,
                 world_size: int, window: int, max_held: int | None = None,
                 batching: str = "tokens", batch_tokens: int | None = None,
                 rows: Callable | None = None):
        self.cache, self.keys, self.extras, self.rows = cache, keys, extras, rows
        self.batching, self.token_budget = batching, batch_tokens or batch_size * max_length
        self.batch_size, self.max_length, self.seed = batch_size, max_length, seed
        self.rank, self.world_size, self.window = rank, world_size, window
        entries = sorted(cache.shards, key=lambda s: s["index"])
        if len(entries) < world_size:
            raise DraftsmithError(
                f"the cache at {cache.folder} has {len(entries)} shard(s) for {world_size} "
                "training processes; each process streams its own shards: rebuild the cache with "
                "a smaller data.cache.shard_tokens, or train on fewer processes")
        self.shards, start = [], 0
        for entry in entries:
            held = held_out(torch.arange(start, start + entry["samples"]), seed, eval_fraction)
            self.shards.append(_Shard(entry, (~held).nonzero().flatten().tolist(),
                                      held.nonzero().flatten().tolist()))
            start += entry["samples"]
        if eval_fraction > 0 and not any(s.held for s in self.shards):  # hold out one at least
            first = self.shards[0]
            first.held, first.train = first.train[:1], first.train[1:]
        if max_held is not None:  # the first max_held held-out samples; past the cap, they train
            left = max_held
            for shard in self.shards:
                keep = shard.held[:left]
                shard.train = sorted(shard.train + shard.held[len(keep):])
                shard.held, left = keep, left - len(keep)
        self.num_train = sum(len(s.train) for s in self.shards)
        self.num_held_out = sum(len(s.held) for s in self.shards)
        self.order = list(range(len(self.shards)))
        random.Random(seed).shuffle(self.order)
        self.mine = [self.shards[i] for i in self.order[rank::world_size]]  # this rank's, for good
        counts = [sum(len(self.shards[i].train) for i in self.order[r::world_size])
                  for r in range(world_size)]
        if min(counts) < (batch_size if batching == "rows" else 1):
            raise DraftsmithError(
                f"the cache at {cache.folder} gives a training process only {min(counts)} "
                f"sequences for a batch of {batch_size} ({self.num_train} in all over "
                f"{world_size} process(es)): add data, lower train.batch_size, or use fewer "
                "processes")
        self.rank_lengths = self._rank_lengths()
        self._lengths = (-1, 0)  # (epoch, its length): the latest asked for

    def _rank_lengths(self) -> list[list[list[int]]]:
        """Per rank, per shard of it (`mine` order), each training sample's batched length."""
        lengths = []
        for shard in self.shards:
            with self.cache.read_shard(shard.entry, []) as reader:
                lengths.append([min(reader.lengths[i], self.max_length) for i in shard.train])
        return [[lengths[i] for i in self.order[r::self.world_size]]
                for r in range(self.world_size)]

    def _shard_order(self, epoch: int, rank: int) -> list[int]:
        """The order rank `rank` reads its shards in `epoch` (positions in its `mine`)."""
        order = list(range(len(self.rank_lengths[rank])))
        random.Random(f"{self.seed}:{epoch}:{rank}").shuffle(order)
        return order

    def _plan(self, epoch: int, rank: int) -> list[list]:
        """Rank `rank`'s batches of `epoch`, each a list of (window, shard in window, index in
        shard), windows in reading order. `rows`: batch_size samples each, a batch may span two
        windows; `tokens`: length-bucketed within each window (`token_batches`); `packed`: each
        batch a list of rows of them, packed within each window (`packing.packed_batches`)."""
        shards = self._shard_order(epoch, rank)
        batches, pending = [], []
        for w in range(0, len(shards), self.window):
            window = shards[w:w + self.window]
            order = [(w, k, i) for k, s in enumerate(window)
                     for i in range(len(self.rank_lengths[rank][s]))]
            random.Random(f"{self.seed}:{epoch}:{rank}:{w}").shuffle(order)
            if self.batching == "rows":
                for item in order:
                    pending.append(item)
                    if len(pending) == self.batch_size:
                        batches.append(pending)
                        pending = []
                continue
            lengths = [self.rank_lengths[rank][window[k]][i] for _, k, i in order]
            rows = max(1, self.token_budget // self.max_length)
            pool = POOL_BATCHES * rows
            if self.batching == "packed":
                batches += [[[order[j] for j in row] for row in batch] for batch in packed_batches(
                    lengths, self.max_length, rows, pool,
                    random.Random(f"{self.seed}:{epoch}:{rank}:{w}:packed"))]
                continue
            batches += [[order[j] for j in batch] for batch in token_batches(
                lengths, self.token_budget, pool, random.Random(f"{self.seed}:{epoch}:{rank}:{w}"))]
        return batches

    def epoch_length(self, epoch: int) -> int:
        """Batches every rank takes in `epoch`: the most the rank with the fewest fills, so DDP
        ranks stay in step."""
        if self._lengths[0] != epoch:
            self._lengths = (epoch, min(len(self._plan(epoch, r)) for r in range(self.world_size)))
        return self._lengths[1]

    def train_batches(self, epoch: int, skip: int = 0, *, float8: bool = False
                      ) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's batches of `epoch` after the first `skip` (exact resume), on the CPU;
        `float8`: float8 rows stay float8 with their row scales (`hidden_states.i.scale`), for
        dequantising on the device (`train/loader.py`)."""
        plan = self._plan(epoch, self.rank)[skip:self.epoch_length(epoch)]
        shards = [self.mine[j] for j in self._shard_order(epoch, self.rank)]
        opened, readers = None, []
        packed = self.batching == "packed"
        with ExitStack() as stack:
            for batch in plan:
                rows = []
                for row in batch if packed else [batch]:
                    samples = []
                    for w, k, i in row:
                        if w != opened:  # windows come in order: the one before is done
                            stack.close()
                            readers = [stack.enter_context(self.cache.read_shard(
                                s.entry, self.keys, self.extras))
                                for s in shards[w:w + self.window]]
                            opened = w
                        samples.append(readers[k].sample(shards[w + k].train[i],
                                                         dequantize=not float8))
                    rows.append(samples)
                yield collate_packed(rows, self.max_length, self.rows) if packed else \
                    collate(rows[0], self.max_length, self.rows)

    def eval_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's share of the held-out samples (every W-th), in data order: the same
        number on every rank (the last `num_held_out % W` samples are left out), so every rank
        runs as many evaluation forwards, each a collective under a sharded target."""
        pending, position = [], 0
        shared = self.num_held_out // self.world_size * self.world_size
        for shard in self.shards:
            mine = [i for n, i in enumerate(shard.held, position) if n % self.world_size ==
                    self.rank and n < shared]
            position += len(shard.held)
            if not mine:
                continue
            for sample in self._read([shard], [(0, i) for i in mine]):
                pending.append(sample)
                if len(pending) == self.batch_size:
                    yield collate(pending, self.max_length, self.rows)
                    pending = []
        if pending:
            yield collate(pending, self.max_length, self.rows)

    def fingerprint(self) -> dict:
        """What a checkpoint records about the data: the cache's inputs and shards, and the
        split (a resumed run must stream the same)."""
        digest = hashlib.sha256(json.dumps(
            [self.cache.manifest["settings"]["samples_sha256"],
             [(s.entry["file"], s.entry["bytes"], s.held) for s in self.shards]]).encode())
        return {"examples": self.num_train + self.num_held_out, "sha256": digest.hexdigest()}

    def num_eval_batches(self) -> int:
        """Held-out batches on each rank (an evaluation's cost in steps)."""
        per_rank = self.num_held_out // self.world_size
        return -(-per_rank // self.batch_size)

    def _read(self, window: list[_Shard], order: list[tuple[int, int]]
              ) -> Iterator[dict[str, torch.Tensor]]:
        """Samples `(shard in window, index in shard)` in that order, the window's shards open."""
        with ExitStack() as stack:
            readers = [stack.enter_context(self.cache.read_shard(s.entry, self.keys, self.extras))
                       for s in window]
            for k, i in order:
                yield readers[k].sample(i)
