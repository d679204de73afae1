"""Export -> load back -> decode: for every format and both target families, the reloaded drafter
proposes exactly the trees the trained one proposed, so greedy speculative decoding gives the same
tokens as before export (and as the target's plain greedy output)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.drafter_folder import LoadedDrafter, load_drafter
from draftsmith.export import ExportOptions, export_drafter, load_any_drafter, load_exported
from tests.helpers.export_helpers import (
    KIND_OF_FORMAT,
    PROMPT,
    decode_with,
    make_checkpoint,
    plain_greedy,
)


def assert_same_state(original: torch.nn.Module, loaded: torch.nn.Module) -> None:
    ours = {k: v for k, v in original.state_dict().items() if not k.startswith("rotary.")}
    theirs = loaded.state_dict()
    for name, value in ours.items():
        torch.testing.assert_close(theirs[name], value, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("fmt", list(KIND_OF_FORMAT))
def test_export_load_decode_matches_before_export(tmp_path, fmt, family):
    kind = KIND_OF_FORMAT[fmt]
    target, module, folder = make_checkpoint(tmp_path, kind, family)
    before, trees_before = decode_with(target, LoadedDrafter(kind, module, {}), PROMPT)

    out = export_drafter(folder, fmt, tmp_path / "export")
    loaded = load_exported(out, target)
    after, trees_after = decode_with(target, loaded, PROMPT)

    assert loaded.kind == kind and loaded.meta["format"] == fmt
    assert loaded.meta["training_steps"] == 7  # from the draftsmith_drafter.json it carries
    assert_same_state(module, loaded.module)
    assert trees_after == trees_before
    assert after.tokens == before.tokens == plain_greedy(target, PROMPT)
    assert max(after.depth_per_step) >= 1, "the drafter never drafted"


@pytest.mark.parametrize("fmt", list(KIND_OF_FORMAT))
def test_export_without_frozen_copies_loads_them_from_the_target(tmp_path, fmt):
    kind = KIND_OF_FORMAT[fmt]
    target, module, folder = make_checkpoint(tmp_path, kind)
    out = export_drafter(folder, fmt, tmp_path / "export", options=ExportOptions(skip_frozen=True))
    (out / "draftsmith_drafter.json").unlink()  # a published drafter: config.json only
    loaded = load_exported(out, target)
    assert_same_state(module, loaded.module)
    assert decode_with(target, loaded, PROMPT)[1] == decode_with(
        target, LoadedDrafter(kind, module, {}), PROMPT)[1]
    assert loaded.meta["training_steps"] is None and loaded.meta["format"] == fmt


def test_load_any_drafter_dispatches_on_config_json(tmp_path):
    target, _, folder = make_checkpoint(tmp_path, "eagle3")
    out = export_drafter(folder, "speculators", tmp_path / "export")
    assert load_any_drafter(out, target).meta["format"] == "speculators"
    assert "format" not in load_any_drafter(folder, target).meta
    assert load_any_drafter(folder, target).kind == load_drafter(folder, target).kind == "eagle3"


def test_bfloat16_export_loads_on_a_bfloat16_target(tmp_path):
    target, module, folder = make_checkpoint(tmp_path, "eagle3")
    out = export_drafter(folder, "eagle3", tmp_path / "export", options=ExportOptions(
        dtype="bfloat16"))
    loaded = load_exported(out, target.to(torch.bfloat16))
    assert loaded.module.fc.weight.dtype == torch.bfloat16
    assert loaded.module.d2t.dtype == torch.long and loaded.module.t2d.dtype == torch.bool
    torch.testing.assert_close(loaded.module.fc.weight, module.fc.weight.to(torch.bfloat16),
                               rtol=0, atol=0)
