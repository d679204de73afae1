"""Counting a draft vocabulary: only loss-masked tokens count; the target's own choices in the
cache's shards count where the next token is trained (None for a shard without them); the data
pipeline's step falls back to the data's tokens and saves what it chose."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from draftsmith.data.render import RenderedSample
from draftsmith.draft_vocab.counting import draft_vocab_step, target_choice_counts, token_counts
from draftsmith.draft_vocab.file import load_draft_vocab


def test_counts_only_loss_masked_tokens():
    samples = [RenderedSample([5, 6, 7, 7], [0, 1, 1, 1]), RenderedSample([7, 9], [1, 0])]
    counts = token_counts(samples, 12)
    assert counts.tolist() == [0, 0, 0, 0, 0, 0, 1, 3, 0, 0, 0, 0]


def _shard(path, choice, mask, lengths, with_choice=True):
    tensors = {"loss_mask": torch.tensor(mask, dtype=torch.uint8),
               "lengths": torch.tensor(lengths, dtype=torch.int64)}
    if with_choice:
        tensors["target_argmax"] = torch.tensor(choice, dtype=torch.int32)
    save_file(tensors, str(path))
    return path


def test_target_choices_count_where_the_next_token_is_trained(tmp_path):
    # two samples of 3 tokens: the choice after token i counts when token i + 1 is trained and
    # in the same sample: after tokens 0, 1 and 3 (choices 1, 2, 4), not after 2 (a sample's end)
    shard = _shard(tmp_path / "a.safetensors", [1, 2, 3, 4, 5, 6], [0, 1, 1, 1, 1, 0], [3, 3])
    assert target_choice_counts([shard], 8).tolist() == [0, 1, 1, 0, 1, 0, 0, 0]
    old = _shard(tmp_path / "b.safetensors", [1], [1], [1], with_choice=False)
    assert target_choice_counts([shard, old], 8) is None
    assert target_choice_counts([], 8) is None


def test_the_step_counts_the_data_without_a_cache_and_saves_the_vocabulary(tmp_path):
    samples = [RenderedSample([1, 2, 2, 3, 3, 3], [1, 1, 1, 1, 1, 1])]
    lines = []
    section = draft_vocab_step(2, 6, samples, [], tmp_path, lines.append)
    assert section["counted_from"] == "the data's tokens" and section["size"] == 2
    assert section["coverage"] == round(5 / 6, 6)
    vocab = load_draft_vocab(section["path"])
    assert vocab.draft_to_target.tolist() == [2, 3]
    assert lines and "draft vocabulary 2 of 6 tokens" in lines[0]
