"""Validation on load names both values of a mismatch; pickle checkpoints are refused unless
explicitly allowed; `draftsmith export --check` validates against a target's config only."""

from __future__ import annotations

import argparse
import json
import pickle

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import (
    add_export_parser,
    check_exported,
    export_drafter,
    load_exported,
)
from tests.helpers.export_helpers import make_checkpoint
from tests.helpers.tiny_targets import tiny_config, tiny_target


@pytest.fixture
def eagle3_export(tmp_path):
    target, module, folder = make_checkpoint(tmp_path, "eagle3")
    return target, module, export_drafter(folder, "speculators", tmp_path / "export")


@pytest.mark.parametrize(("override", "message"), [
    ({"hidden_size": 64}, r"hidden_size=32 but the target has hidden_size=64"),
    ({"vocab_size": 256}, r"vocab_size=128 but the target has vocab_size=256"),
    ({"num_hidden_layers": 2}, r"aux layer ids \[0, 1, 2\].*include \[2\].*num_hidden_layers=2"),
])
def test_mismatch_names_both_values(eagle3_export, override, message):
    _, _, out = eagle3_export
    with pytest.raises(DraftsmithError, match=message):
        load_exported(out, tiny_target("llama", **override))
    with pytest.raises(DraftsmithError, match=message):
        check_exported(out, tiny_config("llama", **override))


def test_draft_vocab_larger_than_the_target_vocab(eagle3_export):
    _, _, out = eagle3_export
    config = json.loads((out / "config.json").read_text())
    config["transformer_layer_config"]["vocab_size"] = 64
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match="vocab_size=64 but the target has vocab_size=128"):
        check_exported(out, tiny_config("llama"))


def test_mtp_numbering_must_follow_the_target(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "mtp")
    out = export_drafter(folder, "mtp", tmp_path / "export")
    with pytest.raises(DraftsmithError, match=r"numbered from layer 4 but the target has "
                                              r"num_hidden_layers=6"):
        check_exported(out, tiny_config("llama", num_hidden_layers=6))


def test_unsupported_speculators_options_are_refused(eagle3_export):
    target, _, out = eagle3_export
    config = json.loads((out / "config.json").read_text())
    config["norm_before_residual"] = True
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match=r"\['norm_before_residual'\]"):
        load_exported(out, target)


def to_pickle(folder, name="pytorch_model.bin", weights="model.safetensors"):
    """Replace the safetensors weights of an export by a pickle file of the same tensors."""
    torch.save(load_file(folder / weights), folder / name)
    (folder / weights).unlink()


def test_pickle_checkpoint_refused_unless_allowed(eagle3_export):
    target, module, out = eagle3_export
    to_pickle(out)
    with pytest.raises(DraftsmithError, match=r"only has pickle checkpoint\(s\) \(pytorch_model.bin\)"
                                              r".*allow_pickle=True"):
        load_exported(out, target)
    loaded = load_exported(out, target, allow_pickle=True)
    torch.testing.assert_close(loaded.module.fc.weight, module.fc.weight, rtol=0, atol=0)


class Payload:
    """Stands for arbitrary code in a pickle: unpickling it would call print()."""

    def __reduce__(self):
        return (print, ("code ran",))


def test_pickle_with_code_is_refused_even_when_allowed(eagle3_export, capsys):
    target, _, out = eagle3_export
    (out / "model.safetensors").unlink()
    (out / "pytorch_model.bin").write_bytes(pickle.dumps({"fc.weight": Payload()}, protocol=2))
    with pytest.raises(DraftsmithError, match="could not be read as plain tensors"):
        load_exported(out, target, allow_pickle=True)
    assert "code ran" not in capsys.readouterr().out


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="draftsmith")
    add_export_parser(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_export_cli_writes_and_checks(tmp_path, capsys):
    target, _, folder = make_checkpoint(tmp_path, "eagle3")
    target.save_pretrained(tmp_path / "target")
    out = tmp_path / "export"
    assert run_cli(["export", str(folder), "--format", "eagle3", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert run_cli(["export", "--check", str(out), "--target", str(tmp_path / "target")]) == 0
    report = capsys.readouterr().out
    assert "ok:" in report and "aux layers [0, 1, 2]" in report and "draft_vocab_size 100" in report
    tiny_target("llama", hidden_size=64).save_pretrained(tmp_path / "wide")
    with pytest.raises(DraftsmithError, match="hidden_size=32 but the target has hidden_size=64"):
        run_cli(["export", "--check", str(out), "--target", str(tmp_path / "wide")])
    with pytest.raises(DraftsmithError, match="--check DIR needs --target"):
        run_cli(["export", "--check", str(out)])
    with pytest.raises(DraftsmithError, match="needs --format, --out"):
        run_cli(["export", str(folder)])


def test_published_medusa_pickle_head_loads_when_allowed(tmp_path):
    """FasterDecoding's releases: config.json with the medusa keys and medusa_lm_head.pt."""
    target, module, folder = make_checkpoint(tmp_path, "medusa")
    out = export_drafter(folder, "medusa", tmp_path / "export")
    (out / "draftsmith_drafter.json").unlink()
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({k: config[k] for k in (
        "medusa_num_heads", "medusa_num_layers", "base_model_name_or_path")}))
    to_pickle(out, "medusa_lm_head.pt", weights="medusa_lm_head.safetensors")
    with pytest.raises(DraftsmithError, match="refuses it"):
        load_exported(out, target)
    loaded = load_exported(out, target, allow_pickle=True)
    assert loaded.meta["target"] == "test-org/tiny-target"
    for name, value in module.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[name], value), name


def test_eagle3_without_recorded_layer_ids_assumes_the_default(tmp_path):
    target, module, folder = make_checkpoint(tmp_path, "eagle3", settings={"draft_vocab_size": 100},
                                        num_hidden_layers=8)
    out = export_drafter(folder, "eagle3", tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="records no EAGLE-3 aux layer ids"):
        loaded = load_exported(out, target)
    assert loaded.module.layer_ids == module.layer_ids == [1, 3, 4]


def test_export_warns_when_the_target_has_no_hub_id(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle1")
    meta = json.loads((folder / "draftsmith_drafter.json").read_text())
    (folder / "draftsmith_drafter.json").write_text(json.dumps({**meta, "target": "./my-model"}))
    with pytest.warns(UserWarning, match="--base-model ORG/NAME"):
        export_drafter(folder, "eagle", tmp_path / "export")
