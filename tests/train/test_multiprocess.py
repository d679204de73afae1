"""A real 2-process data-parallel run through `accelerate launch` on CPU (gloo) matches the
1-process run with the same global batch. `--cpu --num_processes 2` would silently start ONE
process, so the test launches with `--multi_gpu` and checks the recorded world size."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from draftsmith.engines.server_process import free_port
from tests.helpers.tiny_targets import tiny_target

pytestmark = pytest.mark.slow


def save_tiny_target(folder: Path) -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tiny_target("llama").save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(128)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    tokenizer.save_pretrained(folder)


def kill_launch(process: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group and every process it started: torch's elastic agent
    starts each rank in a session of its own, so a rank left behind would hold the output pipes
    open (and `communicate()` with them)."""
    pids, found = [process.pid], True
    while found:
        table = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
        children = [int(p) for p, parent in (line.split() for line in table.splitlines())
                    if int(parent) in pids and int(p) not in pids]
        pids, found = pids + children, bool(children)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_or_explain(make_command, env: dict, attempts: int = 2,
                   timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `make_command()` in a process group of its own, killed whole (its ranks included) on a
    timeout. A timed-out try is retried once with a new command (a new port); the failure names
    what held the CPU meanwhile."""
    for attempt in range(1, attempts + 1):
        command = make_command()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
            return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
        except subprocess.TimeoutExpired:
            busy = subprocess.run(["ps", "-eo", "pid,pgid,pcpu,etime,args", "--sort=-pcpu"],
                                  capture_output=True, text=True).stdout.splitlines()[:12]
            busy = [line[:160] for line in busy]
            kill_launch(process)
            stdout, stderr = process.communicate(timeout=60)
            report = (f"try {attempt} of the 2-process run did not finish in {timeout:g} s; its stderr "
                      f"ends:\n{stderr[-2000:]}\nbusiest processes:\n" + "\n".join(busy))
            print(report, file=sys.stderr)
        except BaseException:  # e.g. pytest-timeout: no rank outlives the test
            kill_launch(process)
            raise
    pytest.fail(report)


def test_two_process_ddp_matches_one_process(tmp_path):
    save_tiny_target(tmp_path / "target")
    gen = torch.Generator().manual_seed(0)
    with open(tmp_path / "data.jsonl", "w") as handle:
        for _ in range(16):  # equal lengths and masks: per-process loss means equal the global one
            ids = torch.randint(2, 128, (16,), generator=gen).tolist()
            handle.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 4 + [1] * 12}) + "\n")
    recipe = {
        "target": {"name": str(tmp_path / "target"), "dtype": "float32"},
        "drafter": {"kind": "eagle3", "draft_vocab_size": 128, "ttt_steps": 2},  # all in vocab
        "data": {"tokenized": str(tmp_path / "data.jsonl")},
        # float32 in both runs: `auto` picks bf16 autocast on a CPU with native bf16
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
    # its own free rendezvous port: accelerate's default 29500 may be held by another run
    two = run_or_explain(lambda: [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), *common, "train.batch_size=2",
        f"train.output_dir={tmp_path / 'two'}"], env)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "terminate called" not in two.stderr

    meta_one = json.loads((tmp_path / "one/drafter/draftsmith_drafter.json").read_text())
    meta_two = json.loads((tmp_path / "two/drafter/draftsmith_drafter.json").read_text())
    assert meta_one["num_processes"] == 1 and meta_two["num_processes"] == 2
    a = load_file(tmp_path / "one/drafter/model.safetensors")
    b = load_file(tmp_path / "two/drafter/model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
    trained = load_file(tmp_path / "one/drafter/model.safetensors")["fc.weight"]
    assert trained.abs().sum() > 0
