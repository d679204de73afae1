"""A full disk ended in a library's traceback (safetensors' "os error 28", torch's "unexpected
pos", never the disk); every write through `write_atomic`, the training run's checkpoints and
drafter folder, and any command's ENOSPC now say "no space left on device at PATH" and the fix
(issue #55)."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.files import disk_space_errors, write_atomic
from tests.bad_input.test_recipe_late_values import write_recipe
from tests.helpers.cli import assert_refused, run_cli

Usage = namedtuple("Usage", "total used free")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_write_the_disk_refuses_names_the_path_and_leaves_no_temporary(tmp_path):
    def write(tmp):
        tmp.write_bytes(b"partial")
        with open("/dev/full", "wb") as full:  # the kernel's ENOSPC
            full.write(b"x" * 100_000)

    with pytest.raises(DraftsmithError, match=rf"no space left on device at {tmp_path}/out.json "
                                              r"\(.* MB free\): free space there or set the "
                                              r"output folder \(train.output_dir"):
        write_atomic(tmp_path / "out.json", write)
    assert list(tmp_path.iterdir()) == []


def test_torchs_unexpected_pos_on_a_full_disk_is_named(tmp_path, monkeypatch):
    short_write = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 "
                               "vs 534")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9, 0))
    with pytest.raises(DraftsmithError, match=r"no space left on device at .*ckpt"), \
            disk_space_errors(tmp_path / "ckpt", "set train.output_dir"):
        raise short_write
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 0, 10**12))
    with pytest.raises(RuntimeError, match="unexpected pos"), disk_space_errors(tmp_path):
        raise short_write  # with room on the disk it is not the disk's fault


def test_training_that_fills_the_disk_names_the_output_dir(tmp_path, tiny_folder, monkeypatch):
    import safetensors.torch

    def full(*args, **kwargs):
        raise Exception("Error while serializing: I/O error: No space left on device (os error "
                        "28)")  # what safetensors raises

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    path = write_recipe(tmp_path, tiny_folder, {"kind": "eagle3", "draft_vocab_size": 128})
    assert_refused(run_cli(["train", "--config", str(path)]),
                   f"no space left on device at {tmp_path / 'run'}", "set train.output_dir")


def test_any_command_ending_in_enospc_names_the_file(tmp_path, monkeypatch):
    import draftsmith.cli

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.bin"))

    monkeypatch.setattr(draftsmith.cli, "cmd_models", full)
    assert_refused(run_cli(["models", "list"]), f"no space left on device at {tmp_path}/x.bin")


def test_a_checkpoint_the_disk_cannot_hold_is_named_and_leaves_no_partial(
        tmp_path, tiny_folder, monkeypatch):
    from accelerate import Accelerator

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Accelerator, "save_state", full)
    path = write_recipe(tmp_path, tiny_folder, {"kind": "eagle3", "draft_vocab_size": 128})
    result = run_cli(["train", "--config", str(path), "train.save_every=1", "train.max_steps=3",
                      "train.warmup_steps=0"])
    assert_refused(result, f"no space left on device at {tmp_path / 'run' / 'checkpoints'}",
                   "lower train.keep_checkpoints")
    assert not list((tmp_path / "run" / "checkpoints").glob("*.partial"))
