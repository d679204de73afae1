"""Training recipes with no target, wrong-typed values or a non-UTF-8 file are refused by
`draftsmith train` before anything is loaded or written, with one line naming the key (issue #18)."""

from __future__ import annotations

import pytest
import yaml

from draftsmith.train.recipe import load_recipe
from tests.helpers.cli import assert_refused, run_cli


def write_recipe(tmp_path, **sections):
    values = {"target": {"name": "smollm2-135m-instruct"}, "drafter": {"kind": "eagle3"},
              "data": {"tokenized": str(tmp_path / "tokenized.jsonl")},
              "train": {"output_dir": str(tmp_path / "run")}}
    values.update(sections)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in values.items() if v is not None}))
    return path


@pytest.mark.parametrize("target", [None, {"dtype": "float32"}], ids=["no-section", "no-name"])
def test_recipe_without_a_target_names_target_name(tmp_path, target):
    path = write_recipe(tmp_path, target=target)
    assert_refused(run_cli(["train", "--config", str(path)]), "names no target",
                   "target: {name: NAME}", "target.name=NAME")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_recipe_without_a_target_is_refused_by_the_real_command(tmp_path):
    path = write_recipe(tmp_path, target=None)
    result = run_cli(["train", "--config", str(path)], subprocess_run=True)
    assert_refused(result, "names no target", "target.name=NAME")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("override", "message"), [
    ("train.save_every=abc", "train.save_every = 'abc': must be an integer"),
    ("train.batch_size=abc", "train.batch_size = 'abc': must be an integer"),
    ("train.batch_size=2.5", "train.batch_size = 2.5: must be an integer"),
    ("train.lr=fast", "train.lr = 'fast': must be a number"),
    ("drafter.step_weight=fast", "drafter.step_weight = 'fast': must be a number"),
])
def test_wrong_typed_values_name_the_key_and_the_type(tmp_path, override, message):
    path = write_recipe(tmp_path)
    assert_refused(run_cli(["train", "--config", str(path), override]), message)
    assert not (tmp_path / "run").exists()


def test_mixed_precision_no_stays_the_string_no(tmp_path):
    path = write_recipe(tmp_path, train={"output_dir": str(tmp_path / "run"),
                                         "mixed_precision": "no"})
    assert load_recipe(path).train.mixed_precision == "no"  # YAML 1.1 would read False
    assert load_recipe(path, ["train.mixed_precision=no"]).train.mixed_precision == "no"


def test_a_non_utf8_recipe_is_refused(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_bytes("target: {name: smollm2-135m-instruct}\n# caf\u00e9\n".encode("latin-1"))
    assert_refused(run_cli(["train", "--config", str(path)]), "is not UTF-8 text",
                   "save it as UTF-8")


@pytest.mark.parametrize("override", ['train.mixed_precision="no"', "train.mixed_precision='no'"])
def test_a_quoted_override_is_read_without_its_quotes(tmp_path, override):
    path = write_recipe(tmp_path)
    assert load_recipe(path, [override]).train.mixed_precision == "no"
