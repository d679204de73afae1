"""Damaged drafter folders end in one clear DraftsmithError each (issue #18)."""

from __future__ import annotations

import json

import pytest

from draftsmith.drafter_folder import load_drafter
from draftsmith.errors import DraftsmithError
from draftsmith.export.source import read_checkpoint
from tests.helpers.export_helpers import make_checkpoint


def _edit_meta(folder, change):
    path = folder / "draftsmith_drafter.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def test_damaged_drafter_folders_give_clear_errors(tmp_path):
    target, _, folder = make_checkpoint(tmp_path, "eagle3")
    load_drafter(folder, target)
    meta_text = (folder / "draftsmith_drafter.json").read_text()
    weights = (folder / "model.safetensors").read_bytes()

    def restore():
        (folder / "draftsmith_drafter.json").write_text(meta_text)
        (folder / "model.safetensors").write_bytes(weights)

    damages = [
        (lambda: (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2]),
         r"model.safetensors is damaged \(truncated or not safetensors"),
        (lambda: (folder / "model.safetensors").unlink(), "model.safetensors is missing"),
        (lambda: (folder / "draftsmith_drafter.json").write_text(meta_text[:40]),
         "draftsmith_drafter.json is not valid JSON"),
        (lambda: _edit_meta(folder, lambda m: m.pop("target_config")),
         "lacks field 'target_config'"),
        (lambda: _edit_meta(folder, lambda m: m.pop("kind")), "lacks field 'kind'"),
        (lambda: _edit_meta(folder, lambda m: m["target_config"].pop("hidden_size")),
         r"target_config lacks positive integer \['hidden_size'\]"),
        (lambda: _edit_meta(folder, lambda m: m.update(drafter_config="big")),
         "malformed .*'drafter_config'"),
        (lambda: _edit_meta(folder, lambda m: m["drafter_config"].update(draft_vocab_size=90)),
         r"does not fit the eagle3 drafter .*lm_head.weight \[100, 32\] \(needs \[90, 32\]\)"),
    ]
    for number, (damage, message) in enumerate(damages):
        damage()
        with pytest.raises(DraftsmithError, match=message):
            load_drafter(folder, target)
        if number < len(damages) - 1:  # export reads the same files without building the module
            with pytest.raises(DraftsmithError, match=message):
                read_checkpoint(folder)
        restore()
    with pytest.raises(DraftsmithError, match=r"drafter folder .*nowhere does not exist"):
        load_drafter(tmp_path / "nowhere", target)
    with pytest.raises(DraftsmithError, match="is a file, not a drafter folder"):
        load_drafter(folder / "model.safetensors", target)
