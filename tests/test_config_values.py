"""Config values reach their fields as the fields declare them: YAML 1.2 booleans, typed overrides."""

from dataclasses import dataclass

import pytest

from draftsmith.config_values import apply_overrides, build_dataclass, load_yaml
from draftsmith.errors import DraftsmithError
from draftsmith.train.recipe import build_recipe, recipe_schema


@dataclass
class Fields:
    text: str = "x"
    count: int = 1
    rate: float = 0.1
    flag: bool = False
    maybe: int | None = None


def build(*overrides: str) -> Fields:
    return build_dataclass(Fields, apply_overrides({}, list(overrides), {"s": Fields}).get("s", {}),
                           "s")


def test_yaml_12_booleans_and_floats():
    assert load_yaml("a: no\nb: off\nc: yes\nd: true\ne: 1e-4\nf: 8\ng: null") == {
        "a": "no", "b": "off", "c": "yes", "d": True, "e": 1e-4, "f": 8, "g": None}


@pytest.mark.parametrize("override,field,value", [
    ("s.text=no", "text", "no"), ("s.text=off", "text", "off"), ("s.text=null", "text", "null"),
    ("s.count=8", "count", 8), ("s.rate=1e-4", "rate", 1e-4), ("s.rate=3", "rate", 3.0),
    ("s.flag=yes", "flag", True), ("s.flag=no", "flag", False), ("s.flag=true", "flag", True),
    ("s.maybe=null", "maybe", None), ("s.maybe=5", "maybe", 5),
])
def test_overrides_take_the_fields_type(override, field, value):
    got = getattr(build(override), field)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("override,message", [
    ("s.count=abc", r"s.count = 'abc': must be an integer"),
    ("s.count=2.5", r"s.count = 2.5: must be an integer"),
    ("s.count=true", r"s.count = True: must be an integer"),
    ("s.rate=fast", r"s.rate = 'fast': must be a number"),
    ("s.flag=maybe", r"s.flag = 'maybe': must be true or false"),
    ("s.maybe=x", r"s.maybe = 'x': must be an integer or null"),
    ("s.colour=red", r"unknown key\(s\) s.colour; valid keys of s: text, count"),
])
def test_bad_values_name_the_key_and_the_type(override, message):
    with pytest.raises(DraftsmithError, match=message):
        build(override)


def test_recipe_mixed_precision_no_and_wrong_types():
    base = {"drafter": {"kind": "eagle3"}}
    recipe = build_recipe(apply_overrides(base, ["train.mixed_precision=no"], recipe_schema))
    assert recipe.train.mixed_precision == "no"
    for override, message in [("train.save_every=abc", "train.save_every = 'abc': must be an integer"),
                              ("train.batch_size=2.5", "train.batch_size = 2.5: must be an integer"),
                              ("drafter.step_weight=fast", "drafter.step_weight = 'fast'")]:
        with pytest.raises(DraftsmithError, match=message):
            build_recipe(apply_overrides({"drafter": {"kind": "eagle3"}}, [override]))
    recipe = build_recipe(apply_overrides({"drafter": {"kind": "eagle3"}},
                                          ["drafter.step_weight=8e-1"]))
    assert recipe.drafter_config.step_weight == 0.8


def test_a_repeated_key_is_an_error_not_a_silent_overwrite(tmp_path):
    from draftsmith.config_values import read_yaml_mapping

    path = tmp_path / "recipe.yaml"
    path.write_text("target: a\ndrafter: {kind: eagle3}\ntarget:\n  name: b\n")
    with pytest.raises(DraftsmithError, match=r"duplicate key 'target' \(first at line 1\)"):
        read_yaml_mapping(path, "recipe", "see recipes/")


@pytest.mark.parametrize("override,field,value", [
    ('s.text="no"', "text", "no"), ("s.text='off'", "text", "off"), ('s.text=""', "text", ""),
    ("s.text='it''s'", "text", "it's"), ('s.count="8"', "count", 8), ("s.flag='no'", "flag", False),
    ('s.text="a"b"', "text", '"a"b"'), ('s.text="', "text", '"'),  # not one quoted string: as is
])
def test_quotes_around_an_override_value_are_quoting_not_text(override, field, value):
    got = getattr(build(override), field)
    assert got == value and type(got) is type(value)


def test_the_quoted_override_an_older_message_advised_reaches_the_recipe_unquoted():
    base = {"drafter": {"kind": "eagle3"}}
    recipe = build_recipe(apply_overrides(base, ['train.mixed_precision="no"'], recipe_schema))
    assert recipe.train.mixed_precision == "no"
    with pytest.raises(DraftsmithError, match=r"train.mixed_precision='fp8': use one of"):
        build_recipe(apply_overrides({"drafter": {"kind": "eagle3"}},
                                     ["train.mixed_precision='fp8'"], recipe_schema))
