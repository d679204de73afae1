"""Shipped recipes by name: `--config llama-3.1-8b/eagle3` resolves the recipe that ships with
draftsmith wherever a recipe is read (train, data run, plan, bench), a real file at the given path
wins, and `draftsmith recipes` lists them all."""

from __future__ import annotations

import pytest

from draftsmith import __version__
from draftsmith.cli import main
from draftsmith.config_values import read_yaml_mapping
from draftsmith.errors import DraftsmithError
from draftsmith.recipes_index import recipes_root, resolve_recipe, shipped_recipes


def test_the_clone_ships_its_recipes_folder():
    root = recipes_root()
    assert root is not None and (root / "llama-3.1-8b" / "eagle3.yaml").is_file()
    names = shipped_recipes()
    assert "llama-3.1-8b/eagle3" in names and "accelerate/ddp" in names
    assert names == sorted(names) and not any(n.endswith(".yaml") for n in names)


@pytest.mark.parametrize("value", ["llama-3.1-8b/eagle3", "llama-3.1-8b/eagle3.yaml",
                                   "recipes/llama-3.1-8b/eagle3", "recipes/llama-3.1-8b/eagle3.yaml"])
def test_a_name_resolves_from_any_folder(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)  # no recipes/ here: only the shipped one can answer
    assert resolve_recipe(value) == recipes_root() / "llama-3.1-8b" / "eagle3.yaml"


def test_a_dotted_name_gets_its_suffix_added(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_recipe("bench/qwen2.5-coder-1.5b") == \
        recipes_root() / "bench" / "qwen2.5-coder-1.5b.yaml"


def test_a_real_path_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "llama-3.1-8b" / "eagle3.yaml"
    own.parent.mkdir()
    own.write_text("target: {name: mine}\n")
    assert resolve_recipe("llama-3.1-8b/eagle3.yaml").resolve() == own
    assert read_yaml_mapping("llama-3.1-8b/eagle3.yaml", "recipe", "")["target"]["name"] == "mine"


@pytest.mark.parametrize("value", ["nowhere/eagle3", "../llama-3.1-8b/eagle3", "/abs/eagle3"])
def test_an_unknown_name_is_refused_pointing_at_the_list(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DraftsmithError, match=r"does not exist; .*`draftsmith recipes` lists"):
        read_yaml_mapping(value, "recipe", "recipes live in recipes/")


def test_every_reader_of_a_recipe_takes_a_name(tmp_path, monkeypatch):
    from draftsmith.bench.config import load_bench_config
    from draftsmith.data.config import load_data_recipe
    from draftsmith.plan.report import plan_recipe
    from draftsmith.train.recipe import load_recipe

    assert load_bench_config("bench/smollm2-135m", "cpu").target == "smollm2-135m-instruct"
    monkeypatch.chdir(tmp_path)
    assert load_recipe("smollm2-135m/eagle3").drafter["kind"] == "eagle3"
    assert load_data_recipe("data/smollm2-135m-sharegpt").target.name == "smollm2-135m-instruct"
    assert plan_recipe("llama-3.1-8b/eagle3", gpu="h100-80gb").target == \
        "meta-llama/Llama-3.1-8B-Instruct"


def test_recipes_verb_lists_every_shipped_recipe(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines()]
    assert listed == shipped_recipes()
    assert "eagle3 drafter for meta-llama/Llama-3.1-8B-Instruct" in out


def test_recipes_path_prints_one_file(capsys):
    assert main(["recipes", "--path", "accelerate/ddp"]) == 0
    assert capsys.readouterr().out.strip() == str(recipes_root() / "accelerate" / "ddp.yaml")
    assert main(["recipes", "--path", "accelerate/none"]) == 2
    assert "no shipped recipe 'accelerate/none'" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"draftsmith {__version__}"
