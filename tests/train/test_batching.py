"""Token-budget batches (`train.batching: tokens`): every sequence once per epoch, each batch within
its budget, padding a few percent where random pairing pads a quarter, the same plan for the same
(seed, epoch), a W-process run's batches the one-process run's split by rows, and an exact resume
by skipping planned batches; and the loader that feeds them (read ahead, float8 dequantised on
the device)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from draftsmith.data.cache_reader import dequantize_rows, scale_key
from draftsmith.errors import DraftsmithError
from draftsmith.train.batching import ExampleBatches, padding_share, token_batches
from draftsmith.train.loader import device_batches, read_ahead, to_device
from draftsmith.train.recipe import TrainSection


def chat_lengths(n=600, seed=0) -> list[int]:
    """Lengths shaped like the quickstart's conversations: a spread of short ones and a pile-up
    at max_length (384) where answers were cut."""
    rng = random.Random(seed)
    return [min(384, int(rng.lognormvariate(5.4, 0.6))) for _ in range(n)]


def test_token_batches_hold_every_sequence_once_within_the_budget():
    lengths = chat_lengths()
    batches = token_batches(lengths, 1536, 256, random.Random(1))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 1536 for b in batches)
    assert batches == token_batches(lengths, 1536, 256, random.Random(1))
    assert batches != token_batches(lengths, 1536, 256, random.Random(2))
    assert token_batches([500, 10], 100, 8, random.Random(0)) in ([[0], [1]], [[1], [0]])
    kept = token_batches([9] * 7, 20, 8, random.Random(0), min_rows=2)  # 2, 2, 2 and 1 left out
    assert sorted(map(len, kept)) == [2, 2, 2]


def test_token_batches_pad_a_few_percent_where_random_pairs_pad_a_quarter():
    lengths = chat_lengths()
    order = list(range(len(lengths)))
    random.Random(0).shuffle(order)
    pairs = [order[i:i + 4] for i in range(0, len(order), 4)]
    bucketed = token_batches(lengths, 4 * 384, 64 * 4, random.Random(0))
    assert padding_share(lengths, pairs) > 0.15
    assert padding_share(lengths, bucketed) < 0.05
    # about as many padded tokens in every batch (but the pools' last ones)
    padded = sorted(len(b) * max(lengths[i] for i in b) for b in bucketed)
    assert padded[len(padded) // 10] > 0.8 * 1536


class Processes(SimpleNamespace):
    """The accelerator's surface `ExampleBatches` reads."""

    def prepare(self, loader):
        return loader


def example_rows(n=40):
    gen = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(2, 128, (5 + i % 13,), generator=gen).tolist(),
             "loss_mask": [1] * (5 + i % 13)} for i in range(n)]


def batches_of(examples, world=1, rank=0, **train) -> ExampleBatches:
    cfg = TrainSection(**{"batch_size": 2, "max_length": 16, "eval_fraction": 0.1,
                          "seed": 3, **train})
    return ExampleBatches(examples, cfg, Processes(num_processes=world, process_index=rank))


def rows_of(batches) -> list[list[tuple]]:
    return [[tuple(row[mask.bool()].tolist()) for row, mask in
             zip(b["input_ids"], b["attention_mask"], strict=True)] for b in batches]


def test_a_two_process_run_splits_the_one_process_batches_by_rows():
    data = example_rows()
    one = rows_of(batches_of(data, batch_size=4).train_batches(0))
    ranks = [rows_of(batches_of(data, world=2, rank=r).train_batches(0)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(one)
    for whole, first, second in zip(one, *ranks, strict=True):
        assert first == whole[0::2] and second == whole[1::2]
    assert sorted(r for b in one for r in b) == sorted(
        tuple(e["input_ids"][:16]) for e in batches_of(data).train_set)


def test_resume_reads_the_planned_batches_after_the_skipped_ones():
    data = batches_of(example_rows(), batch_tokens=32)
    full = rows_of(data.train_batches(1))
    assert len(full) == data.epoch_length(1) > 3
    for skip in (0, 2, len(full)):
        assert rows_of(data.train_batches(1, skip)) == full[skip:]
    assert rows_of(data.train_batches(2)) != full


def test_rows_batching_pairs_batch_size_sequences_and_bad_settings_name_the_fix():
    data = batches_of(example_rows(), batching="rows")
    assert all(b["input_ids"].shape[0] == 2 for b in data.train_batches(0))
    with pytest.raises(DraftsmithError, match=r"train.batching='pack': use one of tokens, packed, rows"):
        TrainSection(batching="pack")
    with pytest.raises(DraftsmithError, match=r"train.batch_tokens=8 is below "
                                              r"train.max_length=16.*raise it"):
        TrainSection(batch_tokens=8, max_length=16)
    with pytest.raises(DraftsmithError, match=r"train.log_interval=0 must be > 0"):
        TrainSection(log_interval=0)


def test_read_ahead_keeps_the_order_raises_where_reading_failed_and_stops_when_left():
    assert list(read_ahead(iter(range(7)), depth=2)) == list(range(7))

    def failing():
        yield 1
        raise OSError("shard vanished")

    seen = []
    with pytest.raises(OSError, match="shard vanished"):
        for item in read_ahead(failing()):
            seen.append(item)
    assert seen == [1]
    pulled = []

    def endless():
        while True:
            pulled.append(len(pulled))
            yield len(pulled)

    source = read_ahead(endless(), depth=2)
    assert next(source) == 1
    source.close()  # joins the thread: at most depth + 2 read, none after
    count = len(pulled)
    assert count <= 4 and len(pulled) == count


def test_float8_rows_are_dequantised_where_the_batch_lands():
    gen = torch.Generator().manual_seed(0)
    values = (torch.randn(2, 5, 8, generator=gen) * 3).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 5, generator=gen) + 0.5
    batch = {"input_ids": torch.ones(2, 5, dtype=torch.long), "hidden_states.3": values,
             scale_key("hidden_states.3"): scale}
    moved = to_device(batch, torch.device("cpu"))
    assert set(moved) == {"input_ids", "hidden_states.3"}
    assert moved["hidden_states.3"].dtype == torch.bfloat16
    for row in range(2):  # equal to the per-sample dequantisation on the host
        assert torch.equal(moved["hidden_states.3"][row], dequantize_rows(values[row], scale[row]))
    fed = list(device_batches(iter([batch, batch]), torch.device("cpu")))
    assert len(fed) == 2 and all(torch.equal(f["hidden_states.3"], moved["hidden_states.3"])
                                 for f in fed)
