"""A decoding method is a value parsed once (`Method.parse`): its base, its drafter's label, its
tree shape, whether prompt lookup joins it; names round-trip."""

from __future__ import annotations

import pytest

from draftsmith.eval.methods import ALL_METHODS, Method


@pytest.mark.parametrize(("name", "base", "label", "shape", "hybrid"), [
    ("plain", "plain", "", None, False),
    ("hf_assisted", "hf_assisted", "", None, False),
    ("drafter", "drafter", "", "default", False),
    ("drafter_dynamic@eagle1", "drafter_dynamic", "eagle1", "dynamic", False),
    ("drafter_chain@a@b", "drafter_chain", "a@b", "chain", False),
    ("drafter_lookup@e3", "drafter_lookup", "e3", "default", True),
])
def test_a_method_name_parses_once_into_its_parts(name, base, label, shape, hybrid):
    method = Method.parse(name)
    assert (method.base, method.label, method.shape, method.with_lookup) == \
        (base, label, shape, hybrid)
    assert method.uses_drafter == base.startswith("drafter")
    assert str(method) == name and Method.parse(method) is method


def test_every_method_name_round_trips_and_default_shapes_follow_the_kind():
    for name in ALL_METHODS:
        assert str(Method.parse(name)) == name
    assert Method.parse("drafter@x").tree_shape("medusa") == "static"
    assert Method.parse("drafter_lookup").tree_shape("eagle3") == "dynamic"
    assert Method.parse("drafter_chain").tree_shape("eagle3") == "chain"
    assert Method.parse("draft_model").needs_draft_model


@pytest.mark.parametrize(("name", "kind", "shown"), [
    ("plain", None, "plain decoding"),
    ("prompt_lookup", None, "prompt lookup"),
    ("drafter_dynamic", "eagle3", "EAGLE-3 (dynamic tree)"),
    ("drafter", "eagle3", "EAGLE-3 (dynamic tree)"),
    ("drafter_lookup@e3", "eagle3", "EAGLE-3 + prompt lookup [e3]"),
    ("drafter_chain@b", "dflash", "DFlash (chain) [b]"),
])
def test_tables_and_plots_name_methods_as_benchmarks_md_does(name, kind, shown):
    assert Method.parse(name).display_name(kind) == shown
