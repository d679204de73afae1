"""A drafter with a reduced draft vocabulary (EAGLE-3) never trains without one: its first Vd
target ids would be arbitrary tokens. Training stops before any step (and `draftsmith train`
before the data pipeline runs), naming the setting and the command that counts the vocabulary."""

from __future__ import annotations

import json

import pytest
import yaml

from draftsmith.errors import DraftsmithError
from draftsmith.train.loop import run_training
from draftsmith.train.recipe import build_recipe
from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.drafters import small_settings
from tests.helpers.tiny_targets import tiny_target
from tests.train.test_loop import examples

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

DRAFT = small_settings("eagle3")["draft_vocab_size"]  # 96 of the tiny targets' 128 tokens


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
