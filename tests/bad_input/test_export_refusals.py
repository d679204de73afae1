"""`draftsmith export` refuses a format that does not hold the drafter's kind, an --out that is a
file, a non-empty folder (without --force; with it, unless it holds a previous export), an --out
that is or holds the drafter folder or its training run, or is inside the drafter folder (a new
folder inside the run is fine), --check on a folder without config.json, and a pickle-only
folder, which is never unpickled (issue #18)."""

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
    args = ["--force"] if force else []
    result = run_cli(["export", str(checkpoint), "--format", "eagle3", "--out", str(folder), *args])
    assert_refused(result, "exists and is not empty, and is not a draftsmith export",
                   "choose another folder; --force replaces only a previous export")
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    file = tmp_path / "export.json"
    file.write_text("{}")
    result = run_cli(["export", str(checkpoint), "--format", "eagle3", "--out", str(file), *args])
    assert_refused(result, f"--out {file} is a file", "choose a folder path")
    assert file.read_text() == "{}" and not (tmp_path / "export.json.partial").exists()


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("fmt", ["eagle3", "gguf"])
@pytest.mark.parametrize("where", ["run", "drafter", "inside drafter", "holds run"])
def test_an_out_over_the_drafter_or_its_run_is_refused_before_any_delete(tmp_path, checkpoint,
                                                                         where, fmt):
    run = checkpoint.parent
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    (run / "checkpoints" / "step_1" / "progress.json").write_text('{"step": 1}')
    before = snapshot(tmp_path)
    out = {"run": run, "drafter": checkpoint, "inside drafter": checkpoint / "export",
           "holds run": tmp_path}[where]
    result = run_cli(["export", str(checkpoint), "--format", fmt, "--out", str(out), "--force"])
    what = (f"the drafter folder {checkpoint}" if where in ("drafter", "inside drafter")
            else f"the training run {run} that {checkpoint} belongs to")
    overlap = {"run": "is", "drafter": "is", "holds run": "holds"}.get(where, "is inside")
    assert_refused(result, f"--out {out} {overlap} {what}", "must stay apart from what training wrote",
                   f"Choose a folder outside it, e.g. --out {tmp_path / 'eagle3-llama-export'}")
    assert snapshot(tmp_path) == before


def test_an_export_into_a_new_folder_inside_the_run_leaves_the_run_as_it_was(tmp_path, checkpoint):
    run = checkpoint.parent
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    before = snapshot(tmp_path)
    for _ in range(2):  # the second replaces the first export (--force), nothing else
        result = run_cli(["export", str(checkpoint), "--format", "eagle3", "--out",
                          str(run / "export"), "--force"])
        assert result.returncode == 0, result.stderr
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if "export" not in str(k)} == before
    assert (run / "export" / "config.json").is_file()


def test_a_partial_folder_over_the_drafter_and_a_run_found_by_its_files_are_refused(tmp_path):
    source = make_checkpoint(tmp_path, "eagle3")[2]
    renamed = source.rename(tmp_path / "mine.partial")  # `--out mine` is written to mine.partial
    before = snapshot(tmp_path)
    result = run_cli(["export", str(renamed), "--format", "eagle3", "--out",
                      str(tmp_path / "mine")])
    assert_refused(result, f"--out {renamed} is the drafter folder {renamed}")
    assert snapshot(tmp_path) == before
    run = tmp_path / "my-run"  # a drafter under another name, beside the run's metrics
    moved = renamed.rename(tmp_path / "eagle3-llama" / "best")
    moved.parent.rename(run)
    (run / "metrics.jsonl").write_text("{}\n")
    result = run_cli(["export", str(run / "best"), "--format", "eagle3", "--out", str(run),
                      "--force"])
    assert_refused(result, f"--out {run} is the training run {run}")
    assert (run / "best" / "model.safetensors").is_file()


def test_force_replaces_a_previous_export_only(tmp_path, checkpoint):
    out = tmp_path / "export"
    for _ in range(2):
        result = run_cli(["export", str(checkpoint), "--format", "eagle3", "--out", str(out),
                          "--force"])
        assert result.returncode == 0, result.stderr
        assert (out / "config.json").is_file() and not (tmp_path / "export.partial").exists()
    (out / "draftsmith_drafter.json").write_text('{"kind": "eagle3"}')  # a training output's record
    result = run_cli(["export", str(checkpoint), "--format", "eagle3", "--out", str(out),
                      "--force"])
    assert_refused(result, "is not a draftsmith export", "--force replaces only a previous export")
    assert (out / "config.json").is_file()


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
