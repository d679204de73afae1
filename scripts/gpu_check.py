"""One short check of draftsmith on a GPU, sized for a lent machine's ten minutes: each stage runs
the real code path a GPU user runs and writes what it found to OUT/gpu_check.json (after every
stage, so a run cut short keeps what it did), its commands' output to OUT/*.log.

    python scripts/gpu_check.py --out DIR [--device cuda] [--stages env,gate,...] [--small]
        [--deadline 600] [--time-scale 1]

Each stage runs in a process of its own, in a session of its own; a stage that outlives its time
is killed whole: its process group and every process it started, torch's elastic workers
included (they start sessions of their own), so no worker keeps the GPU. The run has one
deadline (`--deadline` seconds, default 10 minutes): each stage's time is its own limit or what
is left, whichever is less, a command inside a stage is capped the same way, and a stage with
too little time left is recorded as skipped.

Stages, in the order they run:
  env       the machine: GPU, driver, CUDA, torch and transformers versions
  gate      `draftsmith eval --check-lossless --device cuda`: every registered drafter kind and
            variant (random drafters on a tiny random target), each default tree, chain and
            prompt-lookup hybrid, at batch sizes 1 and 2, float32 greedy; then the sampling gate
            (chi-square of the first tokens) for one kind per family
  attention which attention kernel runs (torch's scaled_dot_product_attention backends, by the
            profiler) in the target's prefill, one-token decode and tree verification, and in an
            EAGLE-3 training step, at the 8B target's attention shapes
  checkpointing  one EAGLE-3 training step of the 8B recipe's drafter (2 x 2,048 tokens, 7 TTT
            steps, 32K draft vocabulary) with and without `train.gradient_checkpointing`: the
            same loss and gradients, and the peak GPU memory of each
  resume    `accelerate launch -m draftsmith.train` stopped by SIGTERM mid-run (it saves a
            checkpoint), run again (it resumes), against an uninterrupted run: the same weights
  offline   `draftsmith data run` (regeneration and the hidden-state cache on the GPU), then
            `train.features=offline` training from that cache
  train     `accelerate launch -m draftsmith.train` (bf16 mixed precision, dtype auto) of EAGLE-3,
            DFlash and Medusa-2 (joint LoRA via peft) on the tiny target, EAGLE-3 again under the
            FSDP2 config with one process, then the default `draftsmith eval --device cuda` of
            the trained drafters with the baselines
  target8b  the Llama-3.1-8B EAGLE-3 recipe's training step (batch 2 x grad_accum 2 x 2,048
            tokens, every position trained) on a randomly initialised target of the real shapes:
            peak GPU memory against `draftsmith plan` for this GPU, and seconds per step
  verify    the verify-cost curve of that target (bf16, batch 1, after 512 tokens) and plain
            decoding tokens/s through draftsmith's runner against transformers' generate
  profile   plain decoding of the tiny target, draftsmith's loop against transformers' generate,
            with the loop's operators by CPU time
--small shrinks the 8B target to 4 layers of width 512 and the 8B steps to 128 tokens, and
--time-scale multiplies every stage's own limit (both to try the script on a CPU, e.g.
`--device cpu --small --time-scale 5 --deadline 1800`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]  # the siblings, a checkout
from gpu_check_stages import STAGES  # noqa: E402

DEADLINE_SECONDS = 600
MIN_STAGE_SECONDS = 15  # a stage with less time left than this is skipped


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (Linux /proc), whatever session or group it is in."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL a process started with `start_new_session=True`: its process group, then every
    process below it in other groups (torch's elastic agent starts each rank in a session of its
    own), repeated while any is left; then reap it."""
    own = os.getpgrp()
    for _ in range(5):
        pids = [process.pid, *descendants(process.pid)] if process.poll() is None \
            else descendants(process.pid)
        groups = {process.pid}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        for group in groups - {own}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()
        if not descendants(process.pid):
            return


class Stage:
    """One stage's process: its record (rewritten to `path` after each step, so a stage killed
    on its timeout keeps what it found), its device, its work folder, its end (time.time()) and
    the factor its commands' time limits are scaled by (`--time-scale`)."""

    def __init__(self, path: Path, out: Path, work: Path, device: str, small: bool,
                 until: float, time_scale: float = 1.0):
        self.path, self.out, self.work = path, out, work
        self.device, self.small, self.until = device, small, until
        self.time_scale = time_scale
        self.record: dict = {}
        self.cuda = device.startswith("cuda")
        self.out_of_time: list[str] = []  # the commands killed or skipped for want of time

    def save(self, **found) -> None:
        """Add `found` to the record and rewrite it whole (a stage killed mid-write leaves the
        previous record)."""
        self.record.update(found)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.record, indent=1, default=str) + "\n")
        partial.replace(self.path)

    def left(self) -> float:
        return self.until - time.time()

    def run(self, name: str, command: list[str], timeout: float = 300, stop_when=None) -> dict:
        """A command in a session of its own, its output appended to OUT/name.log; killed whole
        after `timeout` seconds (times the time scale) or at the stage's end, whichever comes
        first. `stop_when()`, polled every 0.1 s, sends the command's process group SIGTERM once
        it returns True (as a scheduler's preemption does). Returns its exit code ("timeout" or
        "skipped"), seconds and the output's tail."""
        timeout = min(timeout * self.time_scale, self.left() - 2)
        log_path = self.out / f"{name}.log"
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"$ {' '.join(command)}\n")
            start_at = log.tell()
        if timeout <= 0:
            self.out_of_time.append(f"{name} (skipped)")
            return {"rc": "skipped", "seconds": 0, "tail": "no time left in the stage"}
        start = time.perf_counter()
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        environ = dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        with open(log_path, "a", encoding="utf-8") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environ,
                                       cwd=ROOT, start_new_session=True)
            rc, stopped = None, False
            try:
                while rc is None:
                    if time.perf_counter() - start > timeout:
                        kill_tree(process)
                        rc = "timeout"
                        self.out_of_time.append(f"{name} (killed after {timeout:.0f} s)")
                        break
                    if stop_when is not None and not stopped and stop_when():
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(process.pid, signal.SIGTERM)
                        stopped = True
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        rc = process.wait(timeout=0.1)
            finally:
                if process.poll() is None or descendants(process.pid):
                    kill_tree(process)
        with open(log_path, encoding="utf-8", errors="replace") as log:
            log.seek(start_at)
            text = log.read()
        return {"rc": rc, "seconds": round(time.perf_counter() - start, 1), "tail": text[-1500:]}


def run_stage_here(args) -> int:
    """The `--stage` process: one stage, its record in `--record` (rewritten as it goes)."""
    work = Path(args.work) / args.stage
    work.mkdir(parents=True, exist_ok=True)
    stage = Stage(Path(args.record), Path(args.out), work, args.device, args.small, args.until,
                  args.time_scale)
    try:
        found = STAGES[args.stage][0](stage)
        stage.record = {"ok": found.pop("ok_all", True), **stage.record}
        if stage.out_of_time:
            found["error"] = ("timed out: the stage's time ran out for "
                              + ", ".join(stage.out_of_time))
        stage.save(**found)
    except Exception as err:  # a failed stage is the finding: record it and go on
        stage.record = {"ok": False, **stage.record}
        stage.save(error=f"{type(err).__name__}: {err}"[:2000],
                   traceback=traceback.format_exc()[-4000:])
    return 0


def run_stage(name: str, args, work: Path, until: float) -> dict:
    """Run stage `name` in a session of its own until `until` (time.time()); a stage still
    running then is killed whole. Returns its record with `ok` and `seconds`."""
    record = work / f"{name}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--stage", name, "--out", args.out,
               "--device", args.device, "--work", str(work), "--record", str(record),
               "--until", str(until), "--time-scale", str(args.time_scale),
               *(["--small"] if args.small else [])]
    start, limit = time.perf_counter(), until - time.time()
    with open(Path(args.out) / "stages.log", "a", encoding="utf-8") as log:
        log.write(f"== {name}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, HF_HUB_OFFLINE="1"),
                                   start_new_session=True)
        try:
            process.wait(timeout=max(limit, 0))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # also on Ctrl-C: no stage outlives the check
            kill_tree(process)
    result = json.loads(record.read_text()) if record.is_file() else {}
    if timed_out:
        result.update(ok=False, error=f"timed out after {limit:.0f} s; the stage's processes were "
                      "killed (what it had found is kept)")
    elif "ok" not in result:
        result.update(ok=False, error=f"the stage process exited {process.returncode} without a "
                      "result (see stages.log)")
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated, from {', '.join(STAGES)} (env always runs)")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--deadline", type=float, default=DEADLINE_SECONDS,
                        help="seconds the whole run may take")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiplies each stage's own time limit (a CPU try: e.g. 5)")
    parser.add_argument("--stage", choices=list(STAGES), help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--record", help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    if args.stage:
        return run_stage_here(args)
    chosen = set(args.stages.split(",")) | {"env"}
    unknown = sorted(chosen - set(STAGES))
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.deadline
    record = {"device": args.device, "deadline_seconds": args.deadline, "stages": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in (n for n in STAGES if n in chosen):
            left = deadline - time.time()
            if left < MIN_STAGE_SECONDS:
                result = {"ok": False, "skipped": f"{left:.0f} s left of the run's "
                          f"{args.deadline:.0f} s deadline"}
            else:
                result = run_stage(name, args, Path(tmp), time.time()
                                   + min(STAGES[name][1] * args.time_scale, left))
            record["stages"][name] = result
            (out / "gpu_check.json").write_text(json.dumps(record, indent=1) + "\n")
            state = "ok" if result["ok"] else "skipped" if "skipped" in result else "FAILED"
            print(f"[{name}] {state} in {result.get('seconds', 0)} s", flush=True)
    return 0 if all(s["ok"] for s in record["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
