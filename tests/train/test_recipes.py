"""Every training recipe parses into the config dataclasses (its data section too) and opens with
the exact command that runs it; the accelerate configs are valid YAML."""

from pathlib import Path

import pytest
import yaml

from draftsmith.registry import DRAFTERS
from draftsmith.train.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2] / "recipes"
TRAIN_RECIPES = sorted(p for p in ROOT.glob("*/*.yaml") if p.parent.name not in ("accelerate", "data", "bench"))


def test_there_are_recipes_for_every_kind_on_the_default_target():
    kinds = {load_recipe(p).kind for p in ROOT.glob("smollm2-135m/*.yaml")}
    assert kinds == set(DRAFTERS)


@pytest.mark.parametrize("path", TRAIN_RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_parses_and_names_its_command(path):
    recipe = load_recipe(path)
    recipe.check_sections()
    assert recipe.drafter_config is recipe.drafter_config  # built once
    first = path.read_text().splitlines()[0]
    assert first.startswith("# accelerate launch") and str(path.relative_to(ROOT.parent)) in first


@pytest.mark.parametrize("path", sorted(ROOT.glob("accelerate/*.yaml")), ids=lambda p: p.name)
def test_accelerate_configs_are_yaml_with_a_launch_line(path):
    config = yaml.safe_load(path.read_text())
    assert config["distributed_type"] in ("NO", "MULTI_GPU", "FSDP")
    comments = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any(f"accelerate launch --config_file recipes/accelerate/{path.name}" in line
               for line in comments)


def test_overrides_reach_nested_data_settings():
    recipe = load_recipe(ROOT / "smollm2-135m/eagle3.yaml",
                         ["train.lr=1e-4", "data.regenerate.max_new_tokens=64"])
    assert recipe.train.lr == 1e-4
    assert recipe.data_recipe.data.regenerate.max_new_tokens == 64
