"""Export -> load back -> decode: for every format and both target families, the reloaded drafter
proposes exactly the trees the trained one proposed, so greedy speculative decoding gives the same
tokens as before export (and as the target's plain greedy output)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.drafter_folder import LoadedDrafter, load_drafter
from draftsmith.errors import DraftsmithError
from draftsmith.export import ExportOptions, export_drafter, load_any_drafter, load_exported
from tests.helpers.export_helpers import (
    KIND_OF_FORMAT,
    PROMPT,
    SETTINGS,
    build_drafter,
    decode_with,
    make_checkpoint,
    plain_greedy,
    write_checkpoint,
)
from tests.helpers.tiny_targets import tiny_target


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


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
def test_eagle31_exports_with_the_keys_vllm_and_sglang_read_and_decodes_the_same(tmp_path, fmt):
    """EAGLE-3.1: `fc_norm` / `norm_output` at the top of config.json, `fc_norm.{0,1,2}.weight`
    beside `fc.weight`; the reloaded drafter proposes the same trees."""
    import json

    from safetensors.torch import load_file

    settings = {**SETTINGS["eagle3"], "fc_norm": True, "norm_output": True}
    target = tiny_target("llama")
    module = build_drafter("eagle3", target, settings)
    for norm in module.fc_norm:  # not the ones they start as: the export must carry them
        norm.weight.data.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(5))
    folder = write_checkpoint(tmp_path / "drafter", "eagle3", module, target, settings)
    out = export_drafter(folder, fmt, tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["fc_norm"] is True and config["norm_output"] is True
    weights = load_file(out / "model.safetensors")
    for i in range(3):
        torch.testing.assert_close(weights[f"fc_norm.{i}.weight"], module.fc_norm[i].weight,
                                   rtol=0, atol=0)
    loaded = load_exported(out, target)
    assert loaded.module.config.fc_norm and loaded.module.config.norm_output
    assert_same_state(module, loaded.module)
    before = decode_with(target, LoadedDrafter("eagle3", module, {}), PROMPT)
    after = decode_with(target, loaded, PROMPT)
    assert after[1] == before[1]
    assert after[0].tokens == plain_greedy(target, PROMPT)

    config["fc_norm"] = False  # weights and config that disagree are refused when read back
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match="fc_norm: False but the weights hold"):
        load_exported(out, target)
