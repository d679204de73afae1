"""`export --check` refuses an export whose config.json lacks (or contradicts) a key the serving
engines read (issue #18)."""

from __future__ import annotations

import json

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.export.load import check_exported
from draftsmith.export.write import export_drafter
from tests.helpers.export_helpers import make_checkpoint

CASES = [
    ("eagle3", "eagle3", ["hidden_size"], r"lacks 'hidden_size' \(the weights imply 32\)"),
    ("eagle3", "eagle3", ["draft_vocab_size"], r"lacks 'draft_vocab_size' \(the weights imply 100\)"),
    ("eagle3", "eagle3", ["num_key_value_heads"], "lacks 'num_key_value_heads'"),
    ("eagle3", "speculators", ["transformer_layer_config", "hidden_size"],
     "lacks 'transformer_layer_config.hidden_size'"),
    ("eagle3", "speculators", ["draft_vocab_size"], "lacks 'draft_vocab_size'"),
    ("eagle1", "eagle", ["intermediate_size"], r"lacks 'intermediate_size' \(the weights imply 64\)"),
    ("medusa", "medusa", ["hidden_size"], "lacks 'hidden_size'"),
    ("mtp", "mtp", ["num_hidden_layers"], "lacks 'num_hidden_layers'"),
]


def _drop(config: dict, path: list[str]) -> None:
    for key in path[:-1]:
        config = config[key]
    del config[path[-1]]


@pytest.mark.parametrize(("kind", "fmt", "path", "message"), CASES)
def test_check_needs_every_key_the_engines_read(tmp_path, kind, fmt, path, message):
    target, _, folder = make_checkpoint(tmp_path, kind)
    out = export_drafter(folder, fmt, tmp_path / "export")
    check_exported(out, target.config)
    config = json.loads((out / "config.json").read_text())
    _drop(config, path)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match=message):
        check_exported(out, target.config)


def test_check_refuses_a_key_that_contradicts_the_tensors(tmp_path):
    target, _, folder = make_checkpoint(tmp_path, "eagle3")
    out = export_drafter(folder, "eagle3", tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    with pytest.raises(DraftsmithError, match="has intermediate_size=128 but the weights imply 64"):
        check_exported(out, target.config)
