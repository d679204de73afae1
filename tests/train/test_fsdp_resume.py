"""A 2-process run with the target sharded (`accelerate launch --config_file
recipes/accelerate/fsdp.yaml`, CPU, gloo), checkpointed at step 3 and resumed from there, ends with
the very drafter weights (bit for bit) and per-step losses of the uninterrupted run.

On a CPU host accelerate runs the drafter data-parallel (its FSDP plugin needs GPUs): the
checkpoint holds the whole drafter and its optimizer once (accelerate's files) and each process's
random generators; the frozen sharded target is not in it (it is read again from its folder)."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from draftsmith.engines.server_process import free_port
from tests.train.test_fsdp import FSDP_CONFIG, metric_rows
from tests.train.test_multiprocess import run_or_explain, save_tiny_target

pytestmark = pytest.mark.slow


def launch(tmp_path, out_dir) -> str:
    """Train the test's recipe on 2 processes with the target sharded; returns the stdout."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    run = run_or_explain(lambda: [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG),
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port",
        str(free_port()), "-m", "draftsmith.train", "--config", str(tmp_path / "recipe.yaml"),
        f"train.output_dir={out_dir}"], env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_a_sharded_target_run_resumed_at_step_3_ends_bit_identical(tmp_path):
    save_tiny_target(tmp_path / "target")
    gen = torch.Generator().manual_seed(1)
    with open(tmp_path / "data.jsonl", "w") as handle:
        for length in (16, 12, 16, 10, 14, 16, 9, 16) * 2:  # padding differs between batches
            ids = torch.randint(2, 128, (length,), generator=gen).tolist()
            handle.write(json.dumps({"input_ids": ids,
                                     "loss_mask": [0] * 3 + [1] * (length - 3)}) + "\n")
    recipe = {
        "target": {"name": str(tmp_path / "target"), "dtype": "float32"},
        "drafter": {"kind": "eagle3", "draft_vocab_size": 128, "ttt_steps": 2},
        "data": {"tokenized": str(tmp_path / "data.jsonl")},
        "train": {"max_steps": 6, "save_every": 3, "warmup_steps": 2, "lr": 1e-3,
                  "eval_fraction": 0.0, "mixed_precision": "no", "batch_size": 2},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    straight = tmp_path / "straight"
    out = launch(tmp_path, straight)
    assert "resuming" not in out
    checkpoint = straight / "checkpoints" / "step_3"
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "model.safetensors", "optimizer.bin", "progress.json", "rng_state_0.safetensors",
        "rng_state_1.safetensors"]
    saved = load_file(checkpoint / "model.safetensors")
    assert saved and all(key.startswith("drafter.") for key in saved), "no target weight saved"
    held = json.loads((straight / "drafter/draftsmith_drafter.json").read_text())
    assert len(held["target_parameters_per_rank"]) == 2  # the target was sharded over 2 ranks
    assert min(held["target_parameters_per_rank"]) > 0

    # what a kill after step 5 leaves: the step-3 checkpoint and rows up to step 5, no drafter
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "drafter")
    rows = [r for r in metric_rows(resumed / "metrics.jsonl") if r["step"] <= 5]
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = launch(tmp_path, resumed)
    assert f"resuming from {checkpoint.relative_to(straight).as_posix()}" in \
        out.replace(str(resumed) + "/", "")

    losses = {run: {r["step"]: r["loss"] for r in metric_rows(run / "metrics.jsonl")
                    if "loss" in r} for run in (straight, resumed)}
    assert sorted(losses[resumed]) == list(range(1, 7)), "one row per step, 4-6 run again"
    assert losses[resumed] == losses[straight]  # float equality: the same computation
    a = load_file(straight / "drafter/model.safetensors")
    b = load_file(resumed / "drafter/model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0)
    assert not torch.equal(a["fc.weight"], saved["drafter.fc.weight"]), "steps 4-6 trained"
