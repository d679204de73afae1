"""Which of the peer's (vllm-project/speculators) EAGLE-3 recipe differences pay on the quickstart,
at equal wall-clock minutes: each compute class's seconds per step measured first (two runs side
by side, one thread each, as they train), then every arm trained for the steps that fit the same
minutes, its held-out accuracy per draft position, simulated tau and decoded tau on the
benchmark's dynamic tree compared (a benchmark, not a test). The peer itself: peer_speculators.py.

    flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/peer-recipe/bench_peer_recipe.py \
        time
    flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/peer-recipe/bench_peer_recipe.py \
        train --variants adopted,old,peer_all
    .venv/bin/python benchmarks/peer-recipe/bench_peer_recipe.py report
    .venv/bin/python benchmarks/peer-recipe/bench_peer_recipe.py tau --variants adopted --limit 4

`time` and `report` write `--out`; `train` and `tau` write next to each run (`--work`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.target.precision import describe_hardware, hardware_record

RECIPE = "recipes/smollm2-135m/quickstart.yaml"
# each of the peer's differences, as our recipe's overrides (the peer's value); the quickstart
# recipe already has two of them (linear decay, 4 warmup steps)
PEER = {
    "norms": ["drafter.fc_norm=true", "drafter.norm_output=true"],  # EAGLE-3.1's norms
    "weight_decay": ["train.weight_decay=0.01"],  # AdamW's (Muon's is 0.1 in both)
    "frozen_head": ["drafter.freeze_head=true"],  # the target's head rows, untrained
    "step_weight_1": ["drafter.step_weight=1.0"],  # equal weight per TTT step (ours 0.8^k)
    "muon_lr_1e-3": ["train.muon_lr=1e-3"],  # speculators 0.9: muon_lr = lr = 1e-3 (ours 1e-2)
}
OLD = ["train.schedule=wsd", "train.warmup_steps=30"]  # the recipe before this issue
ARMS = {
    "adopted": [],  # today's quickstart recipe: linear decay after 4 warmup steps
    "old": OLD,
    "linear": ["train.warmup_steps=30"],  # the old recipe with linear decay alone
    "warmup_4": ["train.schedule=wsd"],  # the old recipe with 4 warmup steps alone
    **PEER,
    "peer_all": [o for overrides in PEER.values() for o in overrides],
}
# what a step computes differs only with a frozen head and with the norms: one timing each
COMPUTE = {"frozen_head": "frozen_head", "norms": "norms", "peer_all": "peer_all"}
SKIP = 5  # a run's first steps (setup, warm-up) are not timed


def overrides_of(arm: str) -> list[str]:
    """An arm's overrides: an ARMS key, or PEER keys joined by `+` (on today's recipe)."""
    parts = [arm] if arm in ARMS else arm.split("+")
    unknown = [p for p in parts if p not in (ARMS if len(parts) == 1 else PEER)]
    if unknown:
        raise SystemExit(f"unknown arm {arm!r}: use one of {', '.join(ARMS)}, or several of "
                         f"{', '.join(PEER)} joined by +")
    return [o for p in parts for o in ARMS[p]]


def data_overrides(args) -> list[str]:
    """The data folder every arm reads (a copy of the quickstart data's full cache: its data
    settings, so `train` finds it prepared and runs no data step), and the held-out share."""
    return [f"data.out_dir={args.data_dir}", f"data.cache.kinds=[{args.cache_kinds}]",
            f"data.cache.max_minutes={args.cache_minutes:g}",
            f"train.eval_fraction={args.eval_fraction:g}"]


def launch(args, arm: str, steps: int, out_dir: Path) -> subprocess.Popen:
    """One `draftsmith train` of the quickstart recipe with an arm's overrides for `steps` steps,
    on one thread (two arms share the machine's two cores)."""
    command = [sys.executable, "-m", "draftsmith", "train", "--config", RECIPE,
               *data_overrides(args), *overrides_of(arm), f"train.max_steps={steps}",
               "train.max_minutes=null", "train.save_every=0", "train.log_interval=1",
               f"train.output_dir={out_dir}"]
    print("$", " ".join(command), flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(command, stdout=(out_dir / "train.log").open("w"),
                            stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})


def run_side_by_side(args, jobs: list[tuple[str, int, Path]]) -> None:
    """Run (arm, steps, out_dir) jobs `--parallel` at a time; fail on the first that fails."""
    for start in range(0, len(jobs), args.parallel):
        running = [(job, launch(args, *job)) for job in jobs[start:start + args.parallel]]
        for (arm, _, out_dir), process in running:
            if process.wait():
                raise SystemExit(f"{arm}: draftsmith train failed, see {out_dir / 'train.log'}")


def step_seconds(metrics: Path) -> list[float]:
    """Seconds of each step after the first SKIP, from a run's metrics rows."""
    clock = [r["seconds"] for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r]
    return [b - a for a, b in itertools.pairwise(clock[SKIP - 1:])]


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save(path: Path, payload: dict) -> None:
    payload.update(recipe=RECIPE, commit=git_commit(),
                   hardware=describe_hardware(hardware_record("cpu")))
    write_json(path, payload)


def time_arms(args, payload: dict) -> None:
    """Seconds per step of each compute class (today's recipe, a frozen head, the norms, both),
    `--timed-steps` steps each, run side by side as the training runs are."""
    classes = ["adopted", *COMPUTE.values()]
    work = Path(args.work) / "time"
    run_side_by_side(args, [(arm, args.timed_steps, work / arm) for arm in classes])
    timing = payload.setdefault("seconds_per_step", {})
    for arm in classes:
        deltas = step_seconds(work / arm / "metrics.jsonl")
        timing[arm] = {"median": round(statistics.median(deltas), 4),
                       "mean": round(statistics.fmean(deltas), 4), "steps_timed": len(deltas)}


def train_arms(args, payload: dict) -> None:
    """Each arm for the steps its compute class's seconds per step fit into `--minutes`; its final
    held-out evaluation and its own step time, written next to its run (`report` gathers them)."""
    timing = payload.get("seconds_per_step", {})
    jobs = []
    for arm in args.variants:
        seconds = timing[COMPUTE.get(arm, "adopted")]["median"] if timing else None
        if not (args.steps or seconds):
            raise SystemExit("no step timing yet: run the `time` phase first, or pass --steps")
        jobs.append((arm, args.steps or math.floor(args.minutes * 60 / seconds),
                     Path(args.work) / "train" / arm))
    run_side_by_side(args, jobs)
    for arm, steps, out_dir in jobs:
        rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
        final = [r for r in rows if "eval/simulated_tau" in r][-1]
        own = statistics.median(step_seconds(out_dir / "metrics.jsonl"))
        write_json(out_dir / "result.json", {
            "arm": arm, "overrides": overrides_of(arm), "steps": steps,
            "seconds_per_step_own": round(own, 4), "minutes_own": round(steps * own / 60, 2),
            "real_tokens_per_step": round(statistics.fmean(
                r["tokens"] for r in rows if "loss" in r)),
            "drafter": str(out_dir / "drafter"), "data": data_overrides(args),
            **{f"heldout_acc@{k + 1}": round(final[f"eval/acc_{k}"], 4) for k in range(3)},
            "heldout_simulated_tau": round(final["eval/simulated_tau"], 4)})


def report(args, payload: dict) -> None:
    """Gather every arm's result (and the peer's, `peer_speculators.py`) into the payload; print
    the markdown table: minutes at the timed pace (own clock: the load moved while they ran)."""
    timing = payload.get("seconds_per_step", {})
    for path in sorted((Path(args.work) / "train").glob("*/result.json")):
        tau = load(path.parent / "tau.json")
        row = load(path)
        row.setdefault("seconds_per_step_timed", timing[COMPUTE.get(row["arm"], "adopted")]["median"])
        row["minutes_timed"] = round(row["steps"] * row["seconds_per_step_timed"] / 60, 2)
        payload.setdefault("arms", {})[path.parent.name] = {
            **row, **({"decoded_tau": tau} if tau else {})}
    rows = sorted(payload.get("arms", {}).items(),
                  key=lambda item: -item[1]["heldout_simulated_tau"])
    print("| arm | overrides | steps | minutes (own clock) | held-out acc@1 | acc@2 | acc@3 | "
          "simulated tau | decoded tau |\n|---|---|---|---|---|---|---|---|---|")
    for name, row in rows:
        tau = row.get("decoded_tau", {}).get("tau", "-")
        print(f"| {name} | `{' '.join(row['overrides']) or '(the quickstart recipe)'}` | "
              f"{row['steps']} | {row['minutes_timed']:.1f} ({row['minutes_own']:.1f}) | "
              f"{row['heldout_acc@1']:.3f} | {row['heldout_acc@2']:.3f} | "
              f"{row['heldout_acc@3']:.3f} | {row['heldout_simulated_tau']:.3f} | {tau} |")


def tau_variants(args, payload: dict) -> None:
    """tau of each trained variant on the benchmark's dynamic tree (the same prompts and tree
    settings for every variant; greedy, so a run's tau does not depend on the machine's load),
    one `draftsmith eval` per variant, written next to its run (`report` gathers them)."""
    for name in args.variants:
        run = Path(args.work) / "train" / name
        out = Path(args.work) / "eval" / name
        command = [sys.executable, "-m", "draftsmith", "eval", "--target",
                   "smollm2-135m-instruct", "--drafter", str(run / "drafter"),
                   "--methods", "drafter_dynamic", "--num-draft-tokens", "3", "--tree-topk", "3",
                   "--tree-depth", "6", "--tree-total-tokens", str(args.tree_total_tokens),
                   "--bench", "mt_bench,humaneval,gsm8k", "--limit", str(args.limit),
                   "--max-new-tokens", str(args.max_new_tokens), "--out", str(out)]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)
        records = [r for r in load(out / "eval.json")["records"]
                   if r["method"] == "drafter_dynamic"]
        steps = sum(len(r["tokens_per_step"]) for r in records)
        tokens = sum(sum(r["tokens_per_step"]) for r in records)
        write_json(run / "tau.json", {
            "tau": round(tokens / steps, 4), "prompts": len(records), "decoding_steps": steps,
            "command": " ".join(["draftsmith", *command[3:]]),
            "by_set": {k: round(v["drafter_dynamic"]["tau"], 4)
                       for k, v in load(out / "eval.json")["summary"].items()}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("phase", choices=["time", "train", "report", "tau"])
    parser.add_argument("--variants", type=lambda s: s.split(","), default=None)
    parser.add_argument("--steps", type=int, default=None,
                        help="train: these steps instead of the ones the minutes give")
    parser.add_argument("--minutes", type=float, default=6.0,
                        help="train: the wall-clock minutes every arm gets (the quickstart's 6)")
    parser.add_argument("--timed-steps", type=int, default=40)
    parser.add_argument("--parallel", type=int, default=2, help="arms run side by side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per arm")
    parser.add_argument("--limit", type=int, default=4, help="prompts per set (3 sets)")
    parser.add_argument("--tree-total-tokens", default="16")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--work", default="runs/peer-recipe/minutes")
    parser.add_argument("--data-dir", default="runs/peer-recipe/data-full")
    parser.add_argument("--cache-kinds", default="eagle3,peagle",
                        help="the copied cache's data.cache.kinds (its data settings)")
    parser.add_argument("--cache-minutes", type=float, default=10.0,
                        help="the copied cache's data.cache.max_minutes (its data settings)")
    parser.add_argument("--eval-fraction", type=float, default=0.025,
                        help="held out: ~17 of the cache's conversations (the issue's split)")
    parser.add_argument("--out", default="benchmarks/peer-recipe/results.json")
    args = parser.parse_args()
    payload = load(Path(args.out))
    phases = {"time": time_arms, "train": train_arms, "report": report, "tau": tau_variants}
    phases[args.phase](args, payload)
    if args.phase in ("time", "report"):
        save(Path(args.out), payload)


if __name__ == "__main__":
    main()
