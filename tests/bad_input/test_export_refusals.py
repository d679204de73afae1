"""`draftsmith export` refuses a format that does not hold the drafter's kind, an --out that is a
file or a non-empty folder (without --force), --check on a folder without config.json, and a
pickle-only folder, which is never unpickled (issue #18)."""

from __future__ import annotations

import os
import pickle

import pytest

from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.export_helpers import make_checkpoint


@pytest.fixture
def checkpoint(tmp_path):
    return make_checkpoint(tmp_path, "eagle3")[2]


def test_a_format_of_another_kind_is_refused(tmp_path, checkpoint):
    out = tmp_path / "export"
    result = run_cli(["export", str(checkpoint), "--format", "medusa", "--out", str(out)])
    assert_refused(result, "--format medusa holds medusa drafters", "is a eagle3 drafter",
                   "use --format eagle3 or speculators")
    assert not out.exists() and not (tmp_path / "export.partial").exists()


@pytest.mark.parametrize("force", [False, True])
def test_an_out_that_is_not_empty_or_is_a_file_is_refused(tmp_path, checkpoint, force):
    folder = tmp_path / "taken"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    if not force:
        result = run_cli(["export", str(checkpoint), "--format", "eagle3", "--out", str(folder)])
        assert_refused(result, "exists and is not empty", "pass --force to replace it")
        assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    file = tmp_path / "export.json"
    file.write_text("{}")
    args = ["--force"] if force else []
    result = run_cli(["export", str(checkpoint), "--format", "eagle3", "--out", str(file), *args])
    assert_refused(result, f"--out {file} is a file", "choose a folder path")
    assert file.read_text() == "{}" and not (tmp_path / "export.json.partial").exists()


def test_check_on_a_training_output_says_to_export_it_first(tmp_path, checkpoint):
    target = tmp_path / "target"
    make_checkpoint(tmp_path, "eagle3")[0].config.save_pretrained(target)
    result = run_cli(["export", "--check", str(checkpoint), "--target", str(target)])
    assert_refused(result, "has no config.json: not an exported drafter",
                   f"export it first with `draftsmith export {checkpoint} --format FORMAT")


class RunsCode:
    """Unpickling this runs `touch`: proof that a pickle is never loaded unsafely."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("allow", [False, True])
def test_a_pickle_only_folder_is_refused_and_never_unpickled(tmp_path, allow):
    _, _, checkpoint = make_checkpoint(tmp_path, "eagle3")
    target = tmp_path / "target"
    make_checkpoint(tmp_path, "eagle3")[0].config.save_pretrained(target)
    export = tmp_path / "export"
    assert run_cli(["export", str(checkpoint), "--format", "eagle3", "--out", str(export)]
                   ).returncode == 0
    marker = tmp_path / "code-ran"
    (export / "model.safetensors").unlink()
    with open(export / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"fc.weight": RunsCode(marker)}, handle, protocol=2)
    result = run_cli(["export", "--check", str(export), "--target", str(target),
                      *(["--allow-pickle"] if allow else [])])
    if allow:  # weights_only=True rebuilds tensors only: the payload is refused, not run
        assert_refused(result, "pytorch_model.bin could not be read as plain tensors",
                       "only state dicts of tensors")
    else:
        assert_refused(result, "only has pickle checkpoint(s) (pytorch_model.bin)",
                       "`draftsmith export --check` takes --allow-pickle")
    assert not marker.exists()
