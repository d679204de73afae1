"""Recipe values that passed validation and failed late or never (issue #55): a block longer
than the training sequences, Muon's rate without Muon."""

from __future__ import annotations

import json

import pytest
import yaml

from draftsmith.errors import DraftsmithError
from draftsmith.train.recipe import build_recipe
from tests.helpers.cli import assert_refused, run_cli


def write_recipe(tmp_path, folder, drafter, **train):
    rows = [{"input_ids": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14] * 3, "loss_mask": [0] * 5 + [1] * 25}
            for _ in range(8)]
    (tmp_path / "tokenized.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "target": {"name": str(folder), "dtype": "float32"}, "drafter": drafter,
        "data": {"tokenized": str(tmp_path / "tokenized.jsonl")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 1, "warmup_steps": 0,
                  "batch_size": 2, "mixed_precision": "no", **train}}))
    return path


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_a_block_longer_than_the_sequences_is_refused(tmp_path, tiny_folder, kind):
    path = write_recipe(tmp_path, tiny_folder, {"kind": kind}, max_length=256)
    assert_refused(run_cli(["train", "--config", str(path), "drafter.block_size=100000"]),
                   "drafter.block_size=100000 is longer than the training sequences "
                   "(train.max_length=256 tokens)", "use at most 256")
    assert not (tmp_path / "run").exists()
    with pytest.raises(DraftsmithError, match=r"data.max_length=64 tokens"):
        build_recipe({"target": {"name": "x"}, "drafter": {"kind": kind, "block_size": 100},
                      "data": {"max_length": 64}})
    build_recipe({"target": {"name": "x"}, "drafter": {"kind": kind, "block_size": 16},
                  "train": {"max_length": 16}})


def test_muon_lr_without_muon_names_both_keys(tmp_path, tiny_folder):
    path = write_recipe(tmp_path, tiny_folder, {"kind": "eagle3"})
    assert_refused(run_cli(["train", "--config", str(path), "train.muon_lr=0.02"]),
                   "train.muon_lr=0.02", "train.optimizer='adamw'", "train.optimizer=muon",
                   "remove train.muon_lr")
    build_recipe({"target": {"name": "x"}, "drafter": {"kind": "eagle3"},
                  "train": {"optimizer": "muon", "muon_lr": 0.02}})
