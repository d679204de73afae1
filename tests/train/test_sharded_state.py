"""An FSDP2-sharded drafter's training state saved and loaded sharded (`train/sharded_state.py`,
torch.distributed.checkpoint) by the loop's `save_state` and `load_checkpoint`: on 2 processes
(gloo) a run resumed from the checkpoint ends bit-identical to the uninterrupted one, each process
having written only its own rows of every sharded weight and optimizer state; and nothing in such a checkpoint is unpickled but plain values (a planted
object in its metadata or among its values is refused and never runs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from draftsmith.engines.server_process import free_port
from draftsmith.errors import DraftsmithError
from draftsmith.train.sharded_state import (
    PlainMetadataReader,
    PlainValuesLoadPlanner,
    load_sharded_state,
    read_metadata,
    save_sharded_state,
)
from tests.train.test_multiprocess import run_or_explain, save_tiny_target


@pytest.mark.slow
def test_two_processes_resume_a_sharded_drafter_bit_identical_from_their_own_shards(tmp_path):
    save_tiny_target(tmp_path / "target")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               PYTHONPATH=str(Path(__file__).parents[2]))
    run = run_or_explain(lambda: [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), "-m", "tests.helpers.sharded_state_check",
        str(tmp_path / "target"), str(tmp_path / "run")], env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok")  # the resumed losses and weights were equal

    checkpoint = tmp_path / "run" / "checkpoints" / "step_2"
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "progress.json", "rng_state_0.safetensors", "rng_state_1.safetensors", "sharded"]
    folder = checkpoint / "sharded"
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp",
                                                        "__1_0.distcp"]
    metadata = read_metadata(folder / ".metadata")
    for name in ("model.drafter.fc.weight", "optimizer.state.drafter.fc.weight.exp_avg"):
        written = sorted((tuple(index.offset), info.relative_path)
                         for index, info in metadata.storage_data.items() if index.fqn == name)
        rows = metadata.state_dict_metadata[name].size[0]
        # rank r wrote rows [r * rows / 2, ...) into its own file: nothing gathered on one rank
        assert written == [((0, 0), "__0_0.distcp"), ((rows // 2, 0), "__1_0.distcp")], written


class Payload:
    """Pickles to a call that writes `marker` when unpickled (the attack on a checkpoint)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def one_process_save(folder: Path) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A trained step's model and AdamW saved to `folder` (one process: DCP without a group)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).square().sum().backward()
    optimizer.step()
    save_sharded_state(folder, model, optimizer)
    return model, optimizer


def test_one_process_loads_what_it_saved_into_other_weights(tmp_path):
    model, optimizer = one_process_save(tmp_path / "sharded")
    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    other_optimizer = torch.optim.AdamW(other.parameters(), lr=1e-2)
    load_sharded_state(tmp_path / "sharded", other, other_optimizer)
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    saved, loaded = optimizer.state_dict(), other_optimizer.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    for key, state in saved["state"].items():
        for field, value in state.items():
            assert torch.equal(loaded["state"][key][field], value), (key, field)


def test_a_pickled_object_in_the_metadata_is_refused_and_never_runs(tmp_path):
    import pickle

    one_process_save(tmp_path / "sharded")
    marker = tmp_path / "ran"
    (tmp_path / "sharded" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    with pytest.raises(DraftsmithError, match=r"builtins\.exec is not part of a DCP checkpoint"):
        load_sharded_state(tmp_path / "sharded", model, torch.optim.AdamW(model.parameters()))
    assert not marker.exists()


def test_a_pickled_object_among_the_values_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    dcp.save({"weight": torch.ones(2), "planted": Payload(marker)},
             storage_writer=dcp.FileSystemWriter(str(tmp_path / "sharded")))
    state = {"weight": torch.zeros(2), "planted": None}
    with pytest.raises(BaseException, match="'planted' pickles objects other than plain values"):
        dcp.load(state, storage_reader=PlainMetadataReader(str(tmp_path / "sharded")),
                 planner=PlainValuesLoadPlanner())
    assert not marker.exists()
