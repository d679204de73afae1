"""Medusa heads that share the target's frozen output layer (`shared_head`): the Medusa layout
cannot point a head at a target weight, so the export writes the target's head into every head,
says in config.json that it is shared and which target weight it is, and reads back as one shared
copy; decoding with the export is lossless; `--skip-frozen` is refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.drafter_folder import WEIGHTS, load_drafter
from draftsmith.errors import DraftsmithError
from draftsmith.export import export_drafter, load_exported, read_exported
from draftsmith.export.record import ExportOptions
from tests.helpers.export_helpers import PROMPT, decode_with, make_checkpoint, plain_greedy

SHARED = {"num_heads": 3, "num_layers": 1, "shared_head": True}


@pytest.mark.parametrize("tied, weight", [(False, "lm_head.weight"),
                                          (True, "model.embed_tokens.weight")])
def test_shared_head_exports_a_copy_per_head_and_reads_back_shared(tmp_path, tied, weight):
    target, module, folder = make_checkpoint(tmp_path, "medusa", settings=SHARED,
                                             tie_word_embeddings=tied)
    out = export_drafter(folder, "medusa", tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["medusa_shared_head"] is True and config["medusa_shared_head_weight"] == weight
    tensors = load_file(out / "medusa_lm_head.safetensors")
    head = target.get_output_embeddings().weight
    for i in range(3):  # what Medusa's own loader needs: a full head per head
        assert torch.equal(tensors[f"{i}.1.weight"], head)
    drafter, _ = read_exported(out)
    assert drafter.settings == SHARED and "lm_head.weight" in drafter.state
    assert not any(k.startswith("heads.") and k.endswith(".1.weight") for k in drafter.state)
    loaded = load_exported(out, target)
    assert loaded.module.config.shared_head
    hidden = torch.randn(1, 4, target.config.hidden_size)
    torch.testing.assert_close(loaded.module(hidden), module(hidden))
    result, _ = decode_with(target, loaded, PROMPT)
    assert result.tokens == plain_greedy(target, PROMPT)


def test_training_output_without_the_frozen_head_takes_it_from_the_target(tmp_path):
    target, module, folder = make_checkpoint(tmp_path, "medusa", settings=SHARED)
    tensors = load_file(folder / WEIGHTS)
    assert "lm_head.weight" in tensors
    del tensors["lm_head.weight"]
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})
    loaded = load_drafter(folder, target)
    assert torch.equal(loaded.module.lm_head.weight, target.lm_head.weight)
    hidden = torch.randn(1, 4, target.config.hidden_size)
    torch.testing.assert_close(loaded.module(hidden), module(hidden))


def test_skip_frozen_is_refused_for_a_shared_head(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "medusa", settings=SHARED)
    with pytest.raises(DraftsmithError, match=r"--skip-frozen: .* export without --skip-frozen"):
        export_drafter(folder, "medusa", tmp_path / "export",
                       options=ExportOptions(skip_frozen=True))


def test_a_shared_head_claim_over_different_heads_is_refused(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "medusa", settings=SHARED)
    out = export_drafter(folder, "medusa", tmp_path / "export")
    tensors = load_file(out / "medusa_lm_head.safetensors")
    tensors["2.1.weight"] = tensors["2.1.weight"] + 1
    save_file(tensors, out / "medusa_lm_head.safetensors", metadata={"format": "pt"})
    with pytest.raises(DraftsmithError, match="medusa_shared_head but the heads' output layers"):
        read_exported(out)
