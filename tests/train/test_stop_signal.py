"""A training run stopped by SIGTERM (a scheduler's preemption, `kill`) or SIGINT (Ctrl-C) saves a
checkpoint after the step in progress and exits with 128 + the signal's number; the same command
resumes it to the weights of an uninterrupted run. A repeated signal later stops at once; in a
run of several processes a signal that reaches one rank stops them all after the same step."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

import draftsmith.train.loop as loop_module
import draftsmith.train.stop_signal as stop_signal
from draftsmith.bench.train_process import stop_training, training_failure
from draftsmith.engines.server_process import free_port
from draftsmith.train.metrics import MetricsLog
from tests.bad_input.test_resume import KIND, STEPS, assert_same_weights, loss_steps, train
from tests.train.test_multiprocess import kill_launch, save_tiny_target

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The weights of an uninterrupted run."""
    return load_file(train(tmp_path_factory.mktemp("straight")) / "model.safetensors")


def signalled_after_step(monkeypatch, step: int, *signums: int) -> None:
    """Deliver `signums` to this process, one after another, once the loop logs `step`."""

    class Log(MetricsLog):
        def write(self, row):
            super().write(row)
            if row.get("step") == step and "loss" in row:
                for signum in signums:
                    signal.raise_signal(signum)

    monkeypatch.setattr(loop_module, "MetricsLog", Log)


@pytest.mark.parametrize("signums", [(signal.SIGTERM,), (signal.SIGINT, signal.SIGINT)],
                         ids=["sigterm", "ctrl-c-twice-at-once"])
def test_a_stop_signal_saves_after_the_step_and_the_run_resumes_exactly(
        straight, tmp_path, monkeypatch, capfd, signums):
    handlers = {s: signal.getsignal(s) for s in stop_signal.STOP_SIGNALS}
    signalled_after_step(monkeypatch, 3, *signums)
    with pytest.raises(SystemExit) as stopped:
        train(tmp_path, eval_every=4)
    assert stopped.value.code == 128 + signums[0]
    run_dir = tmp_path / KIND
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not any(key.startswith("eval/") for row in rows for key in row), "a stop saves at once"
    # the signal came during step 3's bookkeeping: step 4 is the one in progress when it is seen
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_4"]
    assert not (run_dir / "drafter").exists()
    out = capfd.readouterr()
    assert f"{signal.Signals(signums[0]).name} received: saving a checkpoint" in out.err
    assert out.err.count("received") == 1, "a duplicate delivery is one request"
    assert f"stopped after step 4 by a signal; checkpoint {run_dir / 'checkpoints' / 'step_4'}" \
        in out.out
    assert {s: signal.getsignal(s) for s in stop_signal.STOP_SIGNALS} == handlers

    monkeypatch.undo()
    resumed = train(tmp_path, eval_every=4)
    assert "resuming from" in capfd.readouterr().out
    assert_same_weights(straight, load_file(resumed / "model.safetensors"))
    assert loss_steps(run_dir) == list(range(1, STEPS + 1))


def test_a_second_signal_later_ends_the_process_at_once(tmp_path, monkeypatch):
    """by the signal's default action (faked here: it would end the test run)"""
    killed = []

    def kill(pid, signum):
        killed.append((pid, signum, signal.getsignal(signum)))
        raise SystemExit("killed")

    monkeypatch.setattr(stop_signal, "REPEAT_SECONDS", 0.0)
    monkeypatch.setattr(stop_signal.os, "kill", kill)
    signalled_after_step(monkeypatch, 3, signal.SIGTERM, signal.SIGTERM)
    handlers = {s: signal.getsignal(s) for s in stop_signal.STOP_SIGNALS}
    with pytest.raises(SystemExit, match="killed"):
        train(tmp_path, save_every=2)
    assert killed == [(os.getpid(), signal.SIGTERM, signal.SIG_DFL)]
    checkpoints = tmp_path / KIND / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_2"], "no save after step 3"
    assert {s: signal.getsignal(s) for s in stop_signal.STOP_SIGNALS} == handlers


CHILD = """import signal, sys, time, pathlib
received = []
def stop(signum, frame):
    received.append(signum)
    if len(received) > 1:
        return
    time.sleep(1.0)  # saving
    pathlib.Path(sys.argv[1]).write_text(str(len(received)))
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("repeat_seconds, received", [(2.0, "1"), (0.1, "2")],
                         ids=["twice-at-once-is-one-request", "again-later-is-passed-on"])
def test_a_benchmark_passes_stop_signals_on_and_waits_for_the_save(tmp_path, monkeypatch,
                                                                   repeat_seconds, received):
    """`draftsmith bench` runs training in a process of its own: stopped, it signals that process
    and waits while it saves; a second signal soon after is the same request, a later one is
    passed on."""
    monkeypatch.setattr(stop_signal, "REPEAT_SECONDS", repeat_seconds)
    marker = tmp_path / "saved"
    process = subprocess.Popen([sys.executable, "-c", CHILD, str(marker)], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "ready"
    handlers = {s: signal.getsignal(s) for s in stop_signal.STOP_SIGNALS}
    again = threading.Timer(0.4, os.kill, (os.getpid(), signal.SIGTERM))
    again.start()
    try:
        stop_training(process, signal.SIGTERM)
    finally:
        again.join()
    assert process.returncode == 128 + signal.SIGTERM
    assert marker.read_text() == received
    assert {s: signal.getsignal(s) for s in stop_signal.STOP_SIGNALS} == handlers


@pytest.mark.parametrize("code, message", [
    (143, "was stopped by SIGTERM and saved a checkpoint; run the benchmark again to resume it"),
    (130, "was stopped by SIGINT and saved a checkpoint"),
    (-9, "was killed by SIGKILL; run the benchmark again to resume it from its last checkpoint"),
    (2, "failed (exit 2); fix the error above and run the benchmark again (it resumes)"),
])
def test_a_benchmark_says_how_its_training_ended(code, message):
    assert message in training_failure(Path("r.yaml"), code)


def rank_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of the processes `accelerate launch` started (its children; the rank read from
    their environment)."""
    table = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    ranks = {}
    for pid, parent in (map(int, line.split()) for line in table.splitlines()):
        if parent != launcher:
            continue
        try:
            text = Path(f"/proc/{pid}/environ").read_text()
        except OSError:
            continue
        environ = dict(item.split("=", 1) for item in text.split("\0") if "=" in item)
        if "RANK" in environ and "LOCAL_RANK" in environ:
            ranks[int(environ["RANK"])] = pid
    return ranks


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    save_tiny_target(tmp_path / "target")
    with open(tmp_path / "data.jsonl", "w") as handle:
        for i in range(16):
            handle.write(json.dumps({"input_ids": [(i * 7 + j) % 120 + 2 for j in range(16)],
                                     "loss_mask": [0] * 4 + [1] * 12}) + "\n")
    recipe = {
        "target": {"name": str(tmp_path / "target"), "dtype": "float32"},
        "drafter": {"kind": "eagle3", "draft_vocab_size": 128, "ttt_steps": 2},
        "data": {"tokenized": str(tmp_path / "data.jsonl")},
        "train": {"max_steps": 100_000, "warmup_steps": 0, "eval_fraction": 0.0,
                  "mixed_precision": "no", "batch_size": 2, "output_dir": str(tmp_path / "run")},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    process = subprocess.Popen([
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), "-m", "draftsmith.train",
        "--config", str(tmp_path / "recipe.yaml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 240
        while not (metrics.is_file() and '"loss"' in metrics.read_text()):
            assert process.poll() is None and time.monotonic() < deadline, \
                process.communicate()[1][-3000:] if process.poll() is not None else "no step"
            time.sleep(0.2)
        os.kill(rank_pids(process.pid)[1], signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=180)
    finally:
        kill_launch(process)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    last = max(row["step"] for row in rows if "loss" in row)
    assert last < 100_000
    folder = tmp_path / "run" / "checkpoints" / f"step_{last}"
    assert sorted(p.name for p in folder.iterdir()) == [
        "model.safetensors", "optimizer.bin", "progress.json", "rng_state_0.safetensors",
        "rng_state_1.safetensors"], stderr[-3000:]
    assert json.loads((folder / "progress.json").read_text())["step"] == last
    assert stderr.count("SIGTERM received") == 1
    assert process.returncode != 0 and "terminate called" not in stderr
    # torch elastic's report: the first rank to exit reports 143; when the other is still leaving
    # (its process group, the interpreter's exit) the launcher ends it with SIGTERM (-15). Both
    # ranks saved before either left (the save's barrier), which the checkpoint above shows.
    codes = re.findall(r"exitcode\s*: (-?\d+)", stderr)
    assert codes and "143" in codes and set(codes) <= {"143", "-15"}, stderr[-3000:]
    assert f"stopped after step {last} by a signal" in stdout
    assert not (tmp_path / "run" / "drafter").exists()
