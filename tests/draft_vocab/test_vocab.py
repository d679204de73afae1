"""Choosing a draft vocabulary: the top Vd ids by count as d2t/t2d, coverage, ties, bad sizes."""

import pytest
import torch

from draftsmith.draft_vocab.vocab import build_draft_vocab
from draftsmith.errors import DraftsmithError


def test_d2t_t2d_and_coverage():
    generator = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50, (300,), generator=generator) * (torch.rand(300, generator=generator) < 0.5)
    vocab = build_draft_vocab(counts, 64)
    assert vocab.d2t.dtype == torch.int64 and vocab.d2t.shape == (64,)
    assert vocab.t2d.dtype == torch.bool and vocab.t2d.shape == (300,)
    used = vocab.draft_to_target
    # draft id d maps to target id d + d2t[d]; t2d marks exactly those ids, in ascending order
    assert torch.equal(used, torch.nonzero(vocab.t2d).flatten())
    assert torch.all(used[1:] > used[:-1]) and int(vocab.t2d.sum()) == 64
    # target -> draft: the rank of a kept id among the kept ids
    target_to_draft = torch.cumsum(vocab.t2d.long(), 0) - 1
    assert torch.equal(target_to_draft[used], torch.arange(64))
    # the kept ids are the most frequent ones
    assert counts[used].min() >= counts[~vocab.t2d].max()
    assert vocab.coverage == pytest.approx(float(counts[used].sum() / counts.sum()))


def test_ties_and_unseen_ids_are_deterministic():
    counts = torch.tensor([0, 5, 0, 5, 9, 0, 0, 0])
    vocab = build_draft_vocab(counts, 5)
    assert vocab.draft_to_target.tolist() == [0, 1, 2, 3, 4]  # 4, then tied 1 and 3, then 0, 2
    assert vocab.d2t.tolist() == [0, 0, 0, 0, 0] and vocab.coverage == 1.0
    top2 = build_draft_vocab(counts, 2)
    assert top2.draft_to_target.tolist() == [1, 4] and top2.d2t.tolist() == [1, 3]
    assert top2.coverage == pytest.approx(14 / 19)


def test_bad_sizes():
    with pytest.raises(DraftsmithError, match="between 1 and the target vocabulary size 8"):
        build_draft_vocab(torch.ones(8, dtype=torch.long), 9)
    with pytest.raises(DraftsmithError, match="no loss-masked tokens"):
        build_draft_vocab(torch.zeros(8, dtype=torch.long), 4)
