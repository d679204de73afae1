"""Length-aware batch planning and right-padded collation."""

import torch

from draftsmith.data.batching import collate, iter_token_batches, plan_batches
from draftsmith.data.render import RenderedSample


def test_plan_batches_respects_rows_and_tokens():
    lengths = [10, 500, 30, 40, 20, 490]
    batches = plan_batches(lengths, batch_size=3, batch_tokens=1000)
    assert batches == [[1, 5], [3, 2, 4], [0]]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    # room for the answers too; a sample over budget goes alone
    assert plan_batches(lengths, 8, 1000, extra_tokens=100) == [[1], [5], [3, 2, 4, 0]]
    assert plan_batches([5000, 10], 8, 1000) == [[0], [1]]


def test_collate_pads_right_and_masks():
    samples = [{"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([0, 1, 1]),
                "hidden_states.4": torch.ones(3, 2)},
               {"input_ids": torch.tensor([8]), "loss_mask": torch.tensor([1]),
                "hidden_states.4": torch.full((1, 2), 2.0)}]
    batch = collate(samples)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["hidden_states.4"][1].tolist() == [[2.0, 2.0], [0.0, 0.0], [0.0, 0.0]]


def test_token_batches_split_across_ranks():
    samples = [RenderedSample([i] * (i + 1), [1] * (i + 1), f"s{i}") for i in range(7)]
    seen = []
    for rank in range(2):
        for batch in iter_token_batches(samples, 2, shuffle=True, seed=1, rank=rank, world_size=2):
            seen += [int(row[0]) for row in batch["input_ids"]]
    assert sorted(seen) == list(range(7))
