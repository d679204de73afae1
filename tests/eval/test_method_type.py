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


def _method_name_parsing(tree) -> list[int]:
    """Lines of `tree` that take a method name apart by hand: split/partition at "@", "@" in a
    name, or a prefix/suffix test on `drafter...` or "@..."."""
    import ast

    def by_hand(arg) -> bool:
        values = arg.elts if isinstance(arg, ast.Tuple) else [arg]
        return any(isinstance(v, ast.Constant) and isinstance(v.value, str)
                   and (v.value.startswith(("drafter", "@"))) for v in values)

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            name, arg = node.func.attr, node.args[0]
            split = name in ("split", "rsplit", "partition", "rpartition") and \
                isinstance(arg, ast.Constant) and arg.value == "@"
            if split or (name in ("startswith", "endswith") and by_hand(arg)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                node.left.value == "@" and isinstance(node.ops[0], ast.In | ast.NotIn):
            lines.append(node.lineno)
    return lines


def test_no_method_name_is_parsed_outside_the_method_module():
    """A method is a value: only `decoding/method.py` takes its name apart (issue 51)."""
    import ast
    from pathlib import Path

    import draftsmith
    from draftsmith.decoding import method

    package = Path(draftsmith.__file__).parent
    home = Path(method.__file__)
    found = [f"{path.relative_to(package.parent)}:{line}"
             for path in sorted(package.rglob("*.py")) if path != home
             for line in _method_name_parsing(ast.parse(path.read_text()))]
    assert found == [], f"method names parsed by hand (use Method.parse): {found}"
    assert _method_name_parsing(ast.parse(home.read_text())), "the guard finds the parse it allows"
    caught = ast.parse('a, _, b = m.partition("@")\nm.startswith("drafter")\n"@" in m\n')
    assert _method_name_parsing(caught) == [1, 2, 3]
