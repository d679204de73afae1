"""`train.compile` on and off on one machine in one run: seconds per step and real tokens per
second of `draftsmith train` on a recipe, runs alternated A/B/B/A, the first `--skip` steps of
each run (start-up, compilation and its recompiles) left out (a benchmark, not a test).

    flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/train_step/bench_compile.py \\
        --steps 60 --skip 20 --out benchmarks/train_step/compile.json -- \\
        --config recipes/smollm2-135m/quickstart.yaml data.out_dir=DATA ...

Each run trains `--steps` optimizer steps (`train.max_steps`, no time budget, no checkpoints)
and reads the loop's per-step clock and real tokens from its metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.target.precision import describe_hardware, hardware_record


def run(args, compiled: bool, index: int, overrides: list[str]) -> dict:
    out = Path(args.work) / f"{index}-{'compiled' if compiled else 'eager'}"
    command = [sys.executable, "-m", "draftsmith", "train", *overrides,
               f"train.compile={str(compiled).lower()}", f"train.max_steps={args.steps}",
               "train.max_minutes=null", "train.save_every=0", "train.log_interval=1",
               "train.eval_every=0", f"train.output_dir={out}"]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]
    clock = [r["seconds"] for r in rows]
    timed = rows[args.skip:]
    deltas = [b - a for a, b in zip(clock[args.skip - 1:], clock[args.skip:], strict=False)]
    return {"compile": compiled, "wall_seconds": round(time.perf_counter() - started, 1),
            "seconds_to_first_timed_step": round(clock[args.skip - 1], 1),
            "seconds_per_step_median": round(statistics.median(deltas), 4),
            "real_tokens_per_s": round(sum(r["tokens"] for r in timed) / sum(deltas), 1),
            "final_loss": rows[-1]["loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=20, help="first steps not timed")
    parser.add_argument("--work", default="runs/bench-compile")
    parser.add_argument("--out", required=True)
    args, overrides = parser.parse_known_args()
    overrides = [o for o in overrides if o != "--"]
    runs = [run(args, compiled, i, overrides)
            for i, compiled in enumerate((False, True, True, False))]
    summary = {}
    for compiled in (False, True):
        mine = [r for r in runs if r["compile"] == compiled]
        summary["compiled" if compiled else "eager"] = {
            "seconds_per_step": statistics.median(r["seconds_per_step_median"] for r in mine),
            "real_tokens_per_s": statistics.median(r["real_tokens_per_s"] for r in mine)}
    write_json(Path(args.out), {
        "command": " ".join(["python", *sys.argv]), "commit": git_commit(),
        "hardware": describe_hardware(hardware_record("cpu")), "steps": args.steps,
        "skip": args.skip, "summary": summary, "runs": runs})
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
