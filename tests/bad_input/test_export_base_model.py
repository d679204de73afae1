"""`draftsmith export --base-model` must name a model of the drafter's own sizes (issue #18)."""

from __future__ import annotations

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.export.record import ExportOptions
from draftsmith.export.write import export_drafter
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
