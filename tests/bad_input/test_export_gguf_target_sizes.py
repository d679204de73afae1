"""`export --format gguf --target-dir` of another model than the drafter's target is refused
before llama.cpp's converter runs, with one error naming each size that differs (hidden size,
vocabulary, layers), both values and the folder to pass (issue #55: it quoted the converter's
traceback); the drafter's own target's folder passes the check."""

from __future__ import annotations

import pytest

import draftsmith.export.gguf as gguf_module
from draftsmith.errors import DraftsmithError
from draftsmith.export.gguf import check_target_sizes, target_sizes
from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.export_helpers import TARGET_NAME, make_checkpoint
from tests.helpers.tiny_targets import tiny_config


@pytest.fixture
def drafted(tmp_path, monkeypatch):
    """(the tiny target, an EAGLE-3 drafter folder trained on it); the converter must not run."""
    def converter(*args, **kwargs):
        raise AssertionError("llama.cpp's converter ran on a mismatched target")

    monkeypatch.setattr(gguf_module, "convert_to_gguf", converter)
    target, _, folder = make_checkpoint(tmp_path, "eagle3")
    return target, folder


def test_a_target_dir_of_another_model_is_refused_naming_both_sizes(tmp_path, drafted):
    target, checkpoint = drafted
    other = tmp_path / "other-model"
    config = tiny_config("llama", hidden_size=64, vocab_size=256)
    config.save_pretrained(other)
    want = target.config
    out = tmp_path / "gguf"
    result = run_cli(["export", str(checkpoint), "--format", "gguf", "--out", str(out),
                      "--target-dir", str(other)])
    line = assert_refused(
        result, f"--target-dir {other} holds another model than the one the drafter was trained "
        f"on ({TARGET_NAME})", f"hidden size 64 there but {want.hidden_size} in the drafter's "
        "target", f"vocabulary 256 there but {want.vocab_size} in the drafter's target",
        f"pass --target-dir the Hugging Face folder of {TARGET_NAME}")
    assert "layers" not in line.split("):")[1].split(".")[0]  # the same layer count: not named
    assert not out.exists() and not (tmp_path / "gguf.partial").exists()


def test_the_drafters_own_target_passes_and_nested_text_configs_are_read(tmp_path, drafted):
    target, _ = drafted
    meta = {"target": TARGET_NAME, "target_config": target.config.to_dict()}
    target.config.save_pretrained(tmp_path / "same")
    check_target_sizes(meta, tmp_path / "same")  # no error
    check_target_sizes({"target": TARGET_NAME}, tmp_path / "same")  # no record: nothing to check
    nested = {"model_type": "qwen3_vl", "text_config": {"hidden_size": 32, "vocab_size": 128,
                                                        "num_hidden_layers": 4}}
    assert target_sizes(nested) == {"hidden_size": 32, "vocab_size": 128, "num_hidden_layers": 4}
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("not json")
    with pytest.raises(DraftsmithError, match=r"config\.json is not readable JSON"):
        check_target_sizes(meta, tmp_path / "bad")
