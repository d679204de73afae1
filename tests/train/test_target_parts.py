"""What sharded and offline training refuse, before any weight is read: FSDP version 1, a target
that is not a local transformers folder, a checkpoint without the model's own tensor names."""

from __future__ import annotations

import pytest
from accelerate import Accelerator
from safetensors.torch import load_file, save_file

from draftsmith.errors import DraftsmithError
from draftsmith.target.load import TargetSpec
from draftsmith.train.target_parts import fsdp_requested, load_loss_parts, target_folder

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_fsdp_version_1_is_refused_and_one_process_shards_nothing(monkeypatch):
    accelerator = Accelerator(cpu=True)
    assert not fsdp_requested(accelerator)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(DraftsmithError, match="fsdp_version: 2"):
        fsdp_requested(accelerator)
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert not fsdp_requested(accelerator)  # one process: nothing to shard across


def test_sharded_training_needs_a_local_folder(tmp_path):
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    with pytest.raises(DraftsmithError, match="not a local transformers folder"):
        target_folder(TargetSpec(name=str(tmp_path / "t.gguf")))


def test_a_checkpoint_under_other_names_is_refused(tiny_folder, tmp_path):
    import shutil

    folder = tmp_path / "renamed"
    shutil.copytree(tiny_folder, folder)
    tensors = load_file(folder / "model.safetensors")
    save_file({f"base.{k}": v for k, v in tensors.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(DraftsmithError, match=r"stores no tensors named \['model.embed_tokens"):
        load_loss_parts(TargetSpec(name=str(folder), dtype="float32"), "cpu")
