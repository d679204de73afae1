"""`draftsmith export --base-model` must name a model of the drafter's own sizes (issue #18), and
not another Hub model than the one the drafter was trained for unless told so."""

from __future__ import annotations

import json

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.export.record import ExportOptions
from draftsmith.export.write import export_drafter
from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.export_helpers import make_checkpoint
from tests.helpers.tiny_targets import tiny_config


def test_base_model_with_other_sizes_is_refused_before_writing(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle1")
    out = tmp_path / "out"
    for key, value in (("hidden_size", 64), ("vocab_size", 256), ("num_hidden_layers", 6)):
        other = tmp_path / f"other-{key}"
        tiny_config("llama", **{key: value}).save_pretrained(other)
        with pytest.raises(DraftsmithError, match=rf"--base-model .* has {key}={value} but .* "
                                                  rf"trained for a target with {key}="):
            export_drafter(folder, "eagle", out, options=ExportOptions(base_model=str(other)))
        assert not out.exists() and not (tmp_path / "out.partial").exists()
    same = tmp_path / "same"
    tiny_config("llama").save_pretrained(same)
    export_drafter(folder, "eagle", out, options=ExportOptions(base_model=str(same)))
    assert (out / "config.json").is_file()


@pytest.fixture
def no_hub(monkeypatch):
    """A closed loopback port as the Hub: a Hub id's config cannot be read, at once."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


@pytest.mark.parametrize("recorded, hub_id", [
    ("test-org/tiny-target", "test-org/tiny-target"),
    ("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),  # an offline name's id
])
@pytest.mark.parametrize("fmt", ["eagle", "gguf"])
def test_base_model_naming_another_hub_model_is_refused(tmp_path, no_hub, recorded, hub_id, fmt):
    _, _, folder = make_checkpoint(tmp_path, "eagle3" if fmt == "gguf" else "eagle1")
    meta = json.loads((folder / "draftsmith_drafter.json").read_text())
    (folder / "draftsmith_drafter.json").write_text(json.dumps({**meta, "target": recorded}))
    out = tmp_path / "out"
    result = run_cli(["export", str(folder), "--format", fmt if fmt == "gguf" else "eagle",
                      "--out", str(out), "--base-model", "other-org/other-model"])
    assert_refused(result, f"--base-model other-org/other-model is another model than the one "
                   f"{folder} was trained for: {hub_id} (training target {recorded!r})",
                   f"Leave --base-model out to use {hub_id}", "--allow-base-model-mismatch")
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_base_model_override_and_same_id_in_other_case_are_accepted(tmp_path, no_hub):
    _, _, folder = make_checkpoint(tmp_path, "eagle1")
    for base, allow in (("Test-Org/Tiny-Target", False), ("other-org/tiny-target-awq", True)):
        out = tmp_path / f"out-{allow}"
        with pytest.warns(UserWarning, match=rf"could not read the config of --base-model "
                                             rf"'{base}'.*127\.0\.0\.1:9 is unreachable"):
            export_drafter(folder, "eagle", out, options=ExportOptions(
                base_model=base, allow_base_model_mismatch=allow))
        card = json.loads((out / "draftsmith_drafter.json").read_text())
        assert card["export"]["base_model"] == base


def test_allow_mismatch_without_base_model_is_refused(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle1")
    result = run_cli(["export", str(folder), "--format", "eagle", "--out", str(tmp_path / "out"),
                      "--allow-base-model-mismatch"])
    assert_refused(result, "--allow-base-model-mismatch only applies with --base-model")
    assert not (tmp_path / "out").exists()
