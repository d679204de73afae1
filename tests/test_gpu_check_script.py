"""scripts/gpu_check.py, the check a lent GPU runs, kept working between loans: its stages on this
CPU with the record it writes after each stage, its one deadline, and its timeouts, which kill a
stage's or a command's every process (torch's elastic workers start sessions of their own)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage_in(gpu_check, tmp_path, seconds: float):
    return gpu_check.Stage(tmp_path / "record.json", tmp_path, tmp_path, "cpu", True,
                           time.time() + seconds)


def gone(pid: int, wait: float = 10.0) -> bool:
    """Whether `pid` has exited (a zombie counts: it holds nothing) within `wait` seconds."""
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


# a launcher that starts a worker in a session of its own (as torch's elastic agent does) and one
# in its own process group, writes their pids, and waits
LAUNCHER = """import subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
workers = [subprocess.Popen(sleep, start_new_session=True), subprocess.Popen(sleep)]
open(sys.argv[1], "w").write(" ".join(str(w.pid) for w in workers))
time.sleep(120)
"""


def test_a_timed_out_command_is_killed_with_every_process_it_started(gpu_check, tmp_path):
    pids = tmp_path / "pids"
    stage = stage_in(gpu_check, tmp_path, 60)
    began = time.monotonic()
    done = stage.run("launch", [sys.executable, "-c", LAUNCHER, str(pids)], timeout=3)
    assert done["rc"] == "timeout" and time.monotonic() - began < 20
    workers = [int(pid) for pid in pids.read_text().split()]
    assert len(workers) == 2 and all(gone(pid) for pid in workers)
    assert (tmp_path / "launch.log").read_text().startswith("$ ")


def test_a_command_ends_with_its_stage_whatever_its_own_timeout(gpu_check, tmp_path):
    stage = stage_in(gpu_check, tmp_path, 4)
    began = time.monotonic()
    done = stage.run("sleep", [sys.executable, "-c", "import time; time.sleep(120)"],
                     timeout=300)
    assert done["rc"] == "timeout" and time.monotonic() - began < 15
    assert stage_in(gpu_check, tmp_path, 1).run("late", ["true"])["rc"] == "skipped"


def test_a_stop_request_sends_sigterm_to_the_command_s_process_group(gpu_check, tmp_path):
    trap = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
            "print('ready'.upper(), flush=True)\ntime.sleep(120)\n")
    ready = tmp_path / "trap.log"
    stage = stage_in(gpu_check, tmp_path, 60)
    done = stage.run("trap", [sys.executable, "-c", trap], timeout=60,
                     stop_when=lambda: "READY" in ready.read_text())
    assert done["rc"] == 143


def test_a_stage_is_skipped_when_the_deadline_leaves_it_too_little_time(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu",
                           "--stages", "gate", "--deadline", "10"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert record["deadline_seconds"] == 10 and list(record["stages"]) == ["env", "gate"]
    for stage in record["stages"].values():
        assert stage["ok"] is False and "deadline" in stage["skipped"]
    assert "[gate] skipped" in done.stdout


@pytest.mark.slow
def test_a_stage_past_its_time_is_killed_whole(tmp_path):
    """The gate (25 s or more on a CPU) given 150 s x 0.1: its `eval` is killed (by the stage or,
    while building its fixtures, with the stage), the record says it timed out and the run ends
    on time. Its temporary folder is under tmp_path, so any process left behind would name
    tmp_path on its command line."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"),
                           "--device", "cpu", "--stages", "gate", "--deadline", "60",
                           "--time-scale", "0.1"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 1 and time.monotonic() - began < 60 + 20
    gate = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["stages"]["gate"]
    assert gate["ok"] is False and "timed out" in gate["error"], gate
    left = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(tmp_path) in command:
            left.append(command.replace("\0", " "))
    assert not left, left


@pytest.mark.slow
def test_gate_and_profile_stages_run_on_cpu(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu",
                           "--stages", "gate,profile", "--time-scale", "5", "--deadline",
                           "1000"], capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    assert set(stages) == {"env", "gate", "profile"}
    greedy, sampling = stages["gate"]["greedy"], stages["gate"]["sampling"]
    assert greedy["rc"] == 0 and greedy["failures"] == [] and greedy["checked"] >= 30
    assert sampling["rc"] == 0 and sampling["failures"] == [] and sampling["checked"] >= 8
    assert "on the CPU" in greedy["guarantee"]
    profile = stages["profile"]
    assert profile["runner_ms_per_token"] > 0 and "aten::" in profile["runner_profile"]
    assert (tmp_path / "gate.log").stat().st_size > 0


@pytest.mark.slow
def test_attention_checkpointing_resume_and_offline_stages_run_on_cpu(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu",
                           "--stages", "attention,checkpointing,resume,offline", "--small",
                           "--time-scale", "5", "--deadline", "1000"], capture_output=True,
                          text=True, timeout=1100)
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    assert done.returncode == 0, json.dumps(stages, indent=1)[-4000:]
    attention = stages["attention"]
    for name in ("target_prefill", "target_decode", "target_verify_tree", "eagle3_train_step"):
        assert any("scaled_dot_product" in op for op in attention[name]), (name, attention)
    checkpointing = stages["checkpointing"]
    assert checkpointing["decoder_layers"] > 0 and checkpointing["max_grad_diff_relative"] < 1e-2
    assert checkpointing["on"]["loss"] == checkpointing["off"]["loss"]
    resume = stages["resume"]
    assert resume["stopped"]["rc"] == 143 and resume["stopped"]["checkpoints"]
    assert resume["resumed"]["resumed_at_step"] and resume["resumed"]["every_step_once"]
    assert resume["identical_weights"] and resume["max_abs_diff"] == 0.0
    offline = stages["offline"]
    assert offline["data"]["cache"]["complete"] and offline["train"]["steps"] == 20
    assert offline["train"]["drafter_saved"]
