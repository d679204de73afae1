"""Errors that used to quote a library's exception instead of naming the problem and the fix
(issue #55): each names the file or setting at fault and what to do."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers.cli import assert_refused, run_cli


def plan_recipe(tmp_path, folder):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"target": {"name": str(folder)},
                                    "drafter": {"kind": "eagle3"},
                                    "train": {"output_dir": str(tmp_path / "run")}}))
    return path


@pytest.mark.parametrize("text", ["hidden_size: 32\n", "[1, 2]", "\xff\xfe"],
                         ids=["text", "list", "binary"])
def test_plan_target_config_that_is_no_json_object_is_named(tmp_path, tiny_folder, text):
    recipe = plan_recipe(tmp_path, tiny_folder)
    config = tmp_path / "config.txt"
    config.write_bytes(text.encode("latin-1"))
    assert_refused(run_cli(["plan", str(recipe), "--target-config", str(config)]),
                   f"--target-config {config}", "pass the model's config.json")
