"""Every registered drafter kind is complete: a decoding family that builds its proposer for each
of its tree shapes, a default tree, at least one export format, and engine names only for engines
draftsmith knows; every export format holds a registered kind."""

from __future__ import annotations

import pytest

from draftsmith.decoding.proposers.base import TreeSettings, drafter_family
from draftsmith.export.formats import FORMATS, formats_for_kind
from draftsmith.registry import DRAFTERS
from tests.helpers.drafters import small_settings
from tests.helpers.export_helpers import build_drafter
from tests.helpers.tiny_targets import tiny_target

ENGINES = {"vllm", "sglang", "llama.cpp"}
TREE_SHAPES = {"chain", "static", "dynamic"}


@pytest.mark.parametrize("kind", list(DRAFTERS))
def test_every_kind_has_a_family_a_default_tree_and_an_export_format(kind):
    spec = DRAFTERS[kind]
    assert spec.tree_shapes and set(spec.tree_shapes) <= TREE_SHAPES
    assert spec.default_tree == spec.tree_shapes[0]
    assert formats_for_kind(kind), f"{kind} has no export format"
    assert set(spec.engine_methods) <= ENGINES
    module = build_drafter(kind, tiny_target("llama"), small_settings(kind))
    family = drafter_family(spec.proposer)
    for shape in spec.tree_shapes:
        proposer = family(module, TreeSettings(shape), f"{kind}_{shape}")
        assert proposer.name == f"{kind}_{shape}"
        assert isinstance(proposer.needs_hidden_states, bool)
        for method in ("reset", "propose", "observe", "skip"):  # skip: the hybrid hands steps
            assert callable(getattr(proposer, method)), f"{kind}_{shape} lacks {method}"


def test_every_export_format_holds_a_registered_kind():
    assert {fmt.kind for fmt in FORMATS.values()} <= set(DRAFTERS)


def test_an_unknown_family_names_the_registered_ones():
    from draftsmith.errors import DraftsmithError

    with pytest.raises(DraftsmithError, match="no decoding family 'nope'; registered: block, "
                       "feature, heads, modules"):
        drafter_family("nope")
