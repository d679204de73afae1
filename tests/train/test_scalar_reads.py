"""The training loop reads the device once per metrics row and not otherwise: a step sums its loss,
metrics and real tokens on the device (`LogWindow`), a row every `train.log_interval` steps reduces
and reads them once, and the divergence check reads nothing more.

A `TorchDispatchMode` sees the aten calls that make the host wait for the device
(`_local_scalar_dense`: `.item()`, `int()`, `float()`, `bool()` of a tensor; `nonzero`,
`masked_select`, boolean-mask indexing) and a `TorchFunctionMode` sees `Tensor.tolist` /
`Tensor.numpy` (a copy to the host that no aten call shows on a CPU). The drafter's forward, loss
and backward are left out here: tests/train/test_host_reads.py counts those. Left out too are
reads of tensors that live on the host by construction on every device: torch.optim's step
counters (`state["step"]`, a CPU tensor unless capturable) and the DataLoader's base seed (drawn
from its CPU generator once per epoch).
"""

from __future__ import annotations

import json
import traceback
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from draftsmith.errors import DraftsmithError
from draftsmith.train.loop import Trainer, run_training
from draftsmith.train.loss_module import LossModule
from tests.helpers.state import reset_accelerate
from tests.helpers.tiny_targets import tiny_target
from tests.train.test_loop import examples, recipe_for

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

aten = torch.ops.aten
SCALAR_READS = {aten._local_scalar_dense.default, aten.item.default, aten.nonzero.default,
                aten.masked_select.default}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}
HOST_BY_CONSTRUCTION = ("torch/optim/", "torch/utils/data/")


class Reads(TorchDispatchMode):
    """Counts host reads (see the module docstring) while active and not `paused`."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.paused = False

    def count(self, name: str) -> None:
        if self.paused:
            return
        frames = [f.filename for f in traceback.extract_stack()]
        if not any(part in f for f in frames for part in HOST_BY_CONSTRUCTION):
            self.counts[name] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = func in INDEXING and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))
        if func in SCALAR_READS or boolean_index:
            self.count(str(func))
        return func(*args, **(kwargs or {}))


class Copies(TorchFunctionMode):
    """Counts `Tensor.tolist` / `Tensor.numpy` into `reads`."""

    def __init__(self, reads: Reads):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.tolist, torch.Tensor.numpy):
            self.reads.count(func.__name__)
        return func(*args, **(kwargs or {}))


def counted_run(monkeypatch, recipe, data, target) -> Counter:
    """`run_training` with the loop's steps (`Trainer.fit`) counted, the drafter's forward and
    backward paused."""
    reads = Reads()

    def paused(method):
        def run(*args, **kwargs):
            reads.paused = True
            try:
                return method(*args, **kwargs)
            finally:
                reads.paused = False
        return run

    fit = Trainer.fit

    def counted_fit(self):
        monkeypatch.setattr(type(self.accelerator), "backward",
                            paused(type(self.accelerator).backward))
        with reads, Copies(reads):
            fit(self)

    monkeypatch.setattr(LossModule, "forward", paused(LossModule.forward))
    monkeypatch.setattr(Trainer, "fit", counted_fit)
    run_training(recipe, data, target=target)
    return reads.counts


def loss_rows(folder) -> list[dict]:
    return [row for row in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
            if "loss" in row]


@pytest.mark.parametrize("log_interval", [1, 3])
def test_the_loop_reads_the_device_once_per_row(log_interval, tmp_path, monkeypatch):
    recipe = recipe_for("eagle1", tmp_path, max_steps=6, log_interval=log_interval,
                        mixed_precision="no")
    counts = counted_run(monkeypatch, recipe, examples(), tiny_target("llama"))
    rows = loss_rows(tmp_path / "eagle1")
    assert [r["step"] for r in rows] == list(range(log_interval, 7, log_interval))
    assert counts == Counter({"tolist": len(rows)}), counts  # <= one per optimizer step


def test_a_row_holds_the_means_of_its_steps_and_their_tokens(tmp_path):
    data, target = examples(), tiny_target("llama")
    every = recipe_for("eagle1", tmp_path / "every", max_steps=6, mixed_precision="no")
    windowed = recipe_for("eagle1", tmp_path / "windowed", max_steps=6, log_interval=3,
                          mixed_precision="no")
    run_training(every, data, target=target)
    reset_accelerate()
    run_training(windowed, data, target=target)
    steps, rows = loss_rows(tmp_path / "every" / "eagle1"), loss_rows(tmp_path / "windowed" /
                                                                       "eagle1")
    for row, window in zip(rows, (steps[:3], steps[3:]), strict=True):
        assert row["tokens"] == sum(s["tokens"] for s in window)
        for key in ("loss", "acc_0"):
            assert row[key] == pytest.approx(sum(s[key] for s in window) / 3, rel=1e-6)


def test_divergence_in_a_window_stops_naming_its_steps(tmp_path):
    recipe = recipe_for("eagle1", tmp_path, max_steps=6, log_interval=3, lr=1e12,
                        warmup_steps=0, save_every=3, mixed_precision="no")
    with pytest.raises(DraftsmithError, match=r"the loss is nan at step 1-3: training diverged"):
        run_training(recipe, examples(), target=tiny_target("llama"))
    assert not (tmp_path / "eagle1" / "checkpoints" / "step_3").exists()  # checked before saving
