"""Data recipes: every recipe parses and opens with its command; bad keys and values are named."""

from pathlib import Path

import pytest

from draftsmith.data.config import (
    CacheConfig,
    DataConfig,
    RegenerateConfig,
    apply_overrides,
    load_data_recipe,
)
from draftsmith.errors import DraftsmithError

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes" / "data").glob("*.yaml"))


def test_there_are_data_recipes():
    assert RECIPES


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_recipe_parses_and_opens_with_its_command(path):
    first = path.read_text().splitlines()[0]
    assert first == f"# draftsmith data run --config {path.relative_to(ROOT)}"
    recipe = load_data_recipe(path)
    assert isinstance(recipe.data.regenerate, RegenerateConfig | None)
    assert isinstance(recipe.data.cache, CacheConfig | None)


def test_overrides_beat_the_file(tmp_path):
    path = RECIPES[0]
    recipe = load_data_recipe(path, ["data.limit=8", "data.regenerate.top_p=9e-1",
                                     "data.cache.kinds=[medusa]", "target.dtype=float32",
                                     "data.draft_vocab_size=null"])
    assert recipe.data.limit == 8 and recipe.data.regenerate.top_p == 0.9
    assert recipe.data.cache.kinds == ("medusa",) and recipe.target.dtype == "float32"
    assert recipe.data.draft_vocab_size is None
    assert load_data_recipe(path, ["data.regenerate=null"]).data.regenerate is None


@pytest.mark.parametrize("override,message", [
    ("data.regenrate.seed=1", "unknown key.*data.regenrate; valid keys of data: source"),
    ("data.cache.kind=medusa", "unknown key.*data.cache.kind; valid keys of data.cache: kinds"),
    ("model.name=x", "unknown section.*model.*valid sections: target, data"),
    ("data.regenerate.top_p=0", r"data.regenerate.top_p = 0.0: must be in \(0, 1\]"),
    ("data.regenerate.temperature=hot", "data.regenerate.temperature = 'hot': must be a number"),
    ("data.cache.kinds=[hydra]", r"data.cache.kinds = \['hydra'\]: list one or more of: medusa"),
    ("data.cache.dtype=int8", "data.cache.dtype = 'int8': choose one of: bfloat16"),
    ("data.limit=0", "data.limit = 0: must be a positive integer, or null"),
    ("data.max_length=8", "data.max_length = 8: must be an integer >= 16"),
    ("target.dtype=fp8", "target.dtype = 'fp8': choose one of: auto, float32"),
    ("data.limit", "must look like key=value"),
])
def test_bad_recipes_name_the_field_and_the_fix(override, message):
    with pytest.raises(DraftsmithError, match=message):
        load_data_recipe(RECIPES[0], [override])


def test_missing_or_broken_files(tmp_path):
    with pytest.raises(DraftsmithError, match="does not exist"):
        load_data_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(DraftsmithError, match="not valid YAML"):
        load_data_recipe(bad)


def test_data_section_alone_round_trips():
    config = DataConfig.from_dict({"source": "x.jsonl", "cache": {"kinds": "eagle3"},
                                   "regenerate": {"max_new_tokens": 64}})
    assert config.cache.kinds == ("eagle3",) and config.regenerate.max_new_tokens == 64
    assert DataConfig.from_dict(config.to_dict()) == config
    assert apply_overrides({}, ["a.b.c=1"]) == {"a": {"b": {"c": 1}}}
