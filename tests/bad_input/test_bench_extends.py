"""A benchmark `extends` whose base run's checkpoints were deleted was refused as if they had all
been written after the decay began; it names the deleted checkpoints and the fix (issue #55)."""

from __future__ import annotations

import shutil

import pytest

from draftsmith.bench.extend import seed_extension
from draftsmith.errors import DraftsmithError
from tests.bench.bench_results import record_of
from tests.bench.test_extend import fake_checkpoint

RAW = {"train": {"warmup_steps": 10, "schedule": "wsd", "decay_fraction": 0.2,
                 "max_minutes": 110.0, "max_steps": 8000}}


@pytest.mark.parametrize("deleted", ["folder", "contents"])
def test_an_extension_of_a_run_whose_checkpoints_were_deleted_says_so(tmp_path, deleted):
    base_folder = tmp_path / "train" / "a"
    fake_checkpoint(base_folder, 1623, 2330, 2899.0)
    if deleted == "folder":
        shutil.rmtree(base_folder / "checkpoints")
    else:
        shutil.rmtree(base_folder / "checkpoints" / "step_1623")
    with pytest.raises(DraftsmithError) as refused:
        seed_extension(record_of(label="a"), base_folder, tmp_path / "train" / "b", RAW, "b")
    message = str(refused.value)
    assert "a's run keeps no complete checkpoint" in message
    assert f"{base_folder / 'checkpoints'} is missing or empty" in message
    assert f"Delete {base_folder} so that the benchmark trains a again" in message
    assert "decay, so no longer run" not in message
