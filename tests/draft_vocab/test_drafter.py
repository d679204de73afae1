"""The drafter's side of the draft vocabulary. The mixin holds the identity map until a vocabulary
is installed and refuses other sizes. A drafter with a reduced draft vocabulary (EAGLE-3) never
trains without one: its first Vd target ids would be arbitrary tokens. Training stops before any
step (and `draftsmith train` before the data pipeline runs), naming the setting and the command
that counts the vocabulary."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

from draftsmith.draft_vocab.drafter import DraftVocabMixin
from draftsmith.draft_vocab.vocab import build_draft_vocab
from draftsmith.errors import DraftsmithError
from draftsmith.train.loop import run_training
from draftsmith.train.recipe import build_recipe
from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.drafters import small_settings
from tests.helpers.tiny_targets import tiny_target
from tests.train.test_loop import examples

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

DRAFT = small_settings("eagle3")["draft_vocab_size"]  # 96 of the tiny targets' 128 tokens


class _Head(DraftVocabMixin, nn.Module):
    def __init__(self, draft: int | None, vocab: int):
        super().__init__()
        if draft is not None:
            self.add_draft_vocab(draft, vocab)


def test_the_mixin_maps_the_first_ids_until_a_vocabulary_is_installed():
    head = _Head(3, 8)
    assert head.reduced_vocab and head.draft_ids().tolist() == [0, 1, 2]
    vocab = build_draft_vocab(torch.tensor([0, 4, 0, 9, 0, 0, 7, 0]), 3)
    head.set_draft_vocab(vocab.d2t, vocab.t2d)
    assert head.draft_ids().tolist() == [1, 3, 6] and head.t2d.nonzero().flatten().tolist() == [1, 3, 6]
    with pytest.raises(ValueError, match=r"do not match Vd=3 / V=8"):
        head.set_draft_vocab(vocab.d2t[:2], vocab.t2d)
    whole = _Head(None, 8)
    assert not whole.reduced_vocab and whole.draft_ids() is None
    with pytest.raises(ValueError, match="drafts over the whole vocabulary"):
        whole.set_draft_vocab(vocab.d2t, vocab.t2d)


def test_the_loop_refuses_a_reduced_draft_vocabulary_it_is_not_given(tmp_path):
    recipe = build_recipe({"drafter": {"kind": "eagle3", **small_settings("eagle3")},
                           "train": {"batch_size": 4, "max_steps": 2, "warmup_steps": 0,
                                     "output_dir": str(tmp_path / "run")}})
    with pytest.raises(DraftsmithError, match=rf"drafter.draft_vocab_size={DRAFT} of the target's "
                                              r"128 tokens needs a draft vocabulary .*add "
                                              rf"`draft_vocab_size: {DRAFT}` to its data section, "
                                              r"so that the data pipeline \(`draftsmith data run`"):
        run_training(recipe, examples(), target=tiny_target("llama"))
    assert not (tmp_path / "run").exists(), "stopped before anything was written"


def write_recipe(tmp_path, tiny_folder, data: dict) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "target": {"name": str(tiny_folder), "dtype": "float32"},
        "drafter": {"kind": "eagle3", **small_settings("eagle3")}, "data": data,
        "train": {"output_dir": str(tmp_path / "run"), "batch_size": 4, "max_steps": 2,
                  "warmup_steps": 0}}))
    return str(path)


def test_pre_tokenized_data_without_a_vocabulary_is_refused(tmp_path, tiny_folder):
    (tmp_path / "tokenized.jsonl").write_text("".join(
        json.dumps(row) + "\n" for row in examples()))
    recipe = write_recipe(tmp_path, tiny_folder, {"tokenized": str(tmp_path / "tokenized.jsonl")})
    result = run_cli(["train", "--config", recipe])
    assert_refused(result, "pre-tokenized data (data.tokenized) carries none",
                   "`draftsmith data run --config DATA_RECIPE`", "drafter.draft_vocab_size: 128")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("vocab, phrases", [
    ({}, ["the recipe builds none", f"add `draft_vocab_size: {DRAFT}` to its data section",
          "`draftsmith data run`", "drafter.draft_vocab_size: 128"]),
    ({"draft_vocab_size": 64}, [f"data.draft_vocab_size=64 differs from "
                                f"drafter.draft_vocab_size={DRAFT}"]),
], ids=["missing", "other-size"])
def test_a_data_section_without_the_vocabulary_is_refused_before_the_pipeline_runs(
        tmp_path, tiny_folder, vocab, phrases):
    (tmp_path / "chats.jsonl").write_text(json.dumps({"conversations": [
        {"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]}) + "\n")
    data_dir = tmp_path / "data"
    recipe = write_recipe(tmp_path, tiny_folder, {
        "source": str(tmp_path / "chats.jsonl"), "out_dir": str(data_dir), "regenerate": None,
        **vocab})
    assert_refused(run_cli(["train", "--config", recipe]), *phrases)
    assert not data_dir.exists(), "the data pipeline did not run"
