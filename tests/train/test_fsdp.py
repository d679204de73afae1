"""A real 2-process FSDP run (`accelerate launch --config_file recipes/accelerate/fsdp.yaml`, CPU,
gloo): each rank holds half of the frozen target (FSDP2 shards), the per-step losses and the saved
drafter equal the 1-process run's, and the drafter folder loads and exports.

On a CPU host accelerate turns an FSDP launch into gloo data parallelism for the drafter (its FSDP
plugin needs GPUs); draftsmith shards the frozen target itself (`train/target_parts.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from draftsmith.engines.server_process import free_port
from tests.train.test_multiprocess import run_or_explain, save_tiny_target

pytestmark = pytest.mark.slow
FSDP_CONFIG = Path(__file__).parents[2] / "recipes" / "accelerate" / "fsdp.yaml"


def metric_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_process_fsdp_shards_the_target_and_matches_one_process(tmp_path):
    from transformers import AutoModelForCausalLM

    from draftsmith.drafter_folder import load_drafter
    from draftsmith.export import export_drafter

    save_tiny_target(tmp_path / "target")
    gen = torch.Generator().manual_seed(0)
    with open(tmp_path / "data.jsonl", "w") as handle:
        for _ in range(16):  # equal lengths and masks: the mean of the ranks' losses is the batch's
            ids = torch.randint(2, 128, (16,), generator=gen).tolist()
            handle.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 4 + [1] * 12}) + "\n")
    recipe = {
        "target": {"name": str(tmp_path / "target"), "dtype": "float32"},
        "drafter": {"kind": "eagle3", "draft_vocab_size": 128, "ttt_steps": 2},
        "data": {"tokenized": str(tmp_path / "data.jsonl")},
        "train": {"max_steps": 3, "warmup_steps": 0, "lr": 1e-3, "eval_fraction": 0.0,
                  "mixed_precision": "no"},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    common = ["-m", "draftsmith.train", "--config", str(tmp_path / "recipe.yaml")]
    one = subprocess.run([sys.executable, *common, "train.batch_size=4",
                          f"train.output_dir={tmp_path / 'one'}"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_or_explain(lambda: [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG),
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port",
        str(free_port()), *common, "train.batch_size=2", f"train.output_dir={tmp_path / 'two'}"],
        env)
    assert two.returncode == 0, two.stderr[-3000:]

    target = AutoModelForCausalLM.from_pretrained(tmp_path / "target")
    total = sum(p.numel() for p in target.parameters())
    rows_one = metric_rows(tmp_path / "one/metrics.jsonl")
    rows_two = metric_rows(tmp_path / "two/metrics.jsonl")
    meta_one = json.loads((tmp_path / "one/drafter/draftsmith_drafter.json").read_text())
    meta_two = json.loads((tmp_path / "two/drafter/draftsmith_drafter.json").read_text())
    assert meta_one["num_processes"] == 1 and meta_two["num_processes"] == 2
    held_one, held_two = (m["target_parameters_per_rank"] for m in (meta_one, meta_two))
    assert held_one == [total]
    assert len(held_two) == 2 and sum(held_two) == total  # every weight held once, not twice
    assert all(abs(n / total - 0.5) < 0.05 for n in held_two), (held_two, total)

    losses_one = [r["loss"] for r in rows_one if "loss" in r]
    losses_two = [r["loss"] for r in rows_two if "loss" in r]
    assert len(losses_one) == len(losses_two) == 3
    torch.testing.assert_close(torch.tensor(losses_two), torch.tensor(losses_one),
                               rtol=1e-4, atol=1e-5)

    a = load_file(tmp_path / "one/drafter/model.safetensors")
    b = load_file(tmp_path / "two/drafter/model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5)

    loaded = load_drafter(tmp_path / "two/drafter", target)  # what `draftsmith eval` loads
    torch.testing.assert_close(loaded.module.fc.weight, b["fc.weight"])
    out = export_drafter(tmp_path / "two/drafter", "eagle3", tmp_path / "export")
    assert (out / "config.json").is_file()


def test_sharded_target_and_drafter_gather_back_whole(tmp_path):
    """2 processes: `load_sharded_target`'s shards gather to the checkpoint exactly, and an FSDP2
    drafter's `full_state_dict` (what `save_drafter` writes) equals its unsharded weights."""
    save_tiny_target(tmp_path / "target")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               PYTHONPATH=str(Path(__file__).parents[2]))
    run = run_or_explain(lambda: [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), "-m", "tests.helpers.fsdp_gather_check",
        str(tmp_path / "target")], env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok")


def test_the_sharded_target_has_one_fsdp_root_and_computes_the_whole_models_features(tmp_path):
    """2 processes: `load_sharded_target` leaves exactly one FSDP root, the target itself, over
    every unit (before and after the decoder and the output head run as training runs them), each
    layer's all-gather prefetched by the unit before it, and the same features as the whole model
    (`tests/helpers/fsdp_root_check.py`)."""
    save_tiny_target(tmp_path / "target")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               PYTHONPATH=str(Path(__file__).parents[2]))
    run = run_or_explain(lambda: [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), "-m", "tests.helpers.fsdp_root_check",
        str(tmp_path / "target")], env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok")
