"""draft_vocab.safetensors: a round trip keeps d2t, t2d and the coverage; a missing, damaged,
inconsistent file or one built for another vocabulary ends in one clear error (issue #18)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.draft_vocab.file import load_draft_vocab, read_draft_vocab, save_draft_vocab
from draftsmith.draft_vocab.vocab import build_draft_vocab
from draftsmith.errors import DraftsmithError


def _vocab(vocab_size=128, draft=16):
    return build_draft_vocab(torch.arange(vocab_size, dtype=torch.int64), draft)


def test_a_saved_vocabulary_loads_back(tmp_path):
    vocab = build_draft_vocab(torch.tensor([0, 5, 1, 5, 9, 0, 2, 0]), 3)
    loaded = load_draft_vocab(save_draft_vocab(vocab, tmp_path / "draft_vocab.safetensors"))
    assert torch.equal(loaded.d2t, vocab.d2t) and torch.equal(loaded.t2d, vocab.t2d)
    assert loaded.coverage == vocab.coverage
    with pytest.raises(DraftsmithError, match="does not exist; build it with `draftsmith data run`"):
        load_draft_vocab(tmp_path / "missing.safetensors")


def test_a_draft_vocab_of_another_size_is_refused(tmp_path):
    path = save_draft_vocab(_vocab(), tmp_path / "draft_vocab.safetensors")
    assert read_draft_vocab(path, 128).d2t.numel() == 16
    with pytest.raises(DraftsmithError, match=r"vocabulary of 128 tokens .* but the target has "
                                              r"49,152; delete .*draft_vocab.safetensors"):
        read_draft_vocab(path, 49152)
    assert read_draft_vocab(tmp_path / "none.safetensors", 128) is None


def test_a_damaged_or_inconsistent_draft_vocab_is_refused(tmp_path):
    path = tmp_path / "draft_vocab.safetensors"
    save_draft_vocab(_vocab(), path)
    path.write_bytes(path.read_bytes()[:60])
    with pytest.raises(DraftsmithError, match=r"draft_vocab.safetensors is damaged"):
        read_draft_vocab(path, 128)
    vocab = _vocab()
    save_file({"d2t": vocab.d2t[:10].contiguous(), "t2d": vocab.t2d}, str(path))
    with pytest.raises(DraftsmithError, match=r"inconsistent: d2t \(shape \[10\]\) does not map "
                                              r"onto the 16 tokens t2d marks"):
        read_draft_vocab(path, 128)
