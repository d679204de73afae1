"""`draftsmith data run | show | info` refuse wrong-typed recipe values, flags out of range and
folders that are not data folders, with one line naming the problem and the fix (issue #18)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers.cli import assert_refused, run_cli


@pytest.fixture
def recipe(tmp_path, tiny_folder):
    (tmp_path / "chats.jsonl").write_text(json.dumps({"conversations": [
        {"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]}) + "\n")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "target": {"name": str(tiny_folder), "dtype": "float32"},
        "data": {"source": str(tmp_path / "chats.jsonl"), "out_dir": str(tmp_path / "out"),
                 "cache": {"kinds": ["eagle3"]}}}))
    return path


@pytest.mark.parametrize(("override", "phrases"), [
    ("data.limit=abc", ["data.limit = 'abc': must be an integer or null"]),
    ("data.max_length=8", ["data.max_length = 8: must be an integer >= 16"]),
    ("data.regenerate.temperature=hot", ["data.regenerate.temperature = 'hot': must be a number"]),
    ("data.cache.kinds=5", ["data.cache.kinds = 5: list one or more of: medusa, eagle1"]),
    ("data.cache.aux_layers=abc", ["data.cache.aux_layers = 'abc': list 0-based layer ids"]),
    ("target.device=tpu", ["target.device = 'tpu' is not a device", "use cpu, cuda, cuda:N"]),
])
def test_bad_data_recipe_values_are_refused_before_any_work(tmp_path, recipe, override, phrases):
    assert_refused(run_cli(["data", "run", "--config", str(recipe), override, "--no-progress"]),
                   *phrases)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--limit", "0"], "argument --limit: 0 must be >= 1"),
    (["--max-length", "8"], "argument --max-length: 8 must be >= 16"),
])
def test_data_show_flags_out_of_range_are_refused(args, message):
    assert_refused(run_cli(["data", "show", *args]), message)


def test_data_show_on_a_folder_that_is_not_data(tmp_path, tiny_folder):
    result = run_cli(["data", "show", "--target", str(tiny_folder), "--source", str(tiny_folder)])
    assert_refused(result, f"{tiny_folder} is not a data folder", "pass a .json/.jsonl file",
                   "regenerated/ folder")


@pytest.mark.parametrize("case", ["missing", "file", "plain-folder", "out-dir"])
def test_data_info_on_what_is_not_a_data_folder(tmp_path, case):
    path = tmp_path / "thing"
    if case == "file":
        path.write_text("x")
    elif case == "plain-folder":
        path.mkdir()
    elif case == "out-dir":  # the data.out_dir itself: point at the folders inside it
        (path / "cache").mkdir(parents=True)
        (path / "cache" / "manifest.json").write_text('{"kind": "feature_cache", "shards": []}')
    phrase = {"missing": "does not exist", "file": "is a file",
              "plain-folder": "holds no manifest.json", "out-dir": f"pass {path / 'cache'}"}[case]
    assert_refused(run_cli(["data", "info", str(path)]), phrase,
                   "cache" if case == "out-dir" else "regenerated/ or cache/ folder")
