"""Which of the peer's (vllm-project/speculators) EAGLE-3 recipe differences pay on the quickstart,
at equal wall-clock minutes: each variant's seconds per step measured in one interleaved timing
run, then each trained for the steps that fit the same minutes, held-out accuracy per draft
position and tau on the benchmark's dynamic tree compared (a benchmark, not a test).

    flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/peer-recipe/bench_peer_recipe.py \
        time --variants baseline,frozen_head,norms,peer_all
    .venv/bin/python benchmarks/peer-recipe/bench_peer_recipe.py train --base-steps 375 \
        --variants baseline,step_weight_1,...
    .venv/bin/python benchmarks/peer-recipe/bench_peer_recipe.py report
    .venv/bin/python benchmarks/peer-recipe/bench_peer_recipe.py tau --variants baseline --limit 4

Every phase adds to one JSON (`--out`); a variant trained or timed again replaces its entry.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.target.precision import describe_hardware, hardware_record

RECIPE = "recipes/smollm2-135m/quickstart.yaml"
# each of the differences alone, as our recipe's overrides (the peer's value)
DIFFERENCES = {
    "step_weight_1": ["drafter.step_weight=1.0"],  # equal weight per TTT step (ours 0.8^k)
    "frozen_head": ["drafter.freeze_head=true"],  # the target's head rows, untrained
    "norms": ["drafter.fc_norm=true", "drafter.norm_output=true"],  # EAGLE-3.1's norms
    "muon_lr_1e-3": ["train.muon_lr=1e-3"],  # speculators 0.9: muon_lr = lr = 1e-3 (ours 1e-2)
    "linear": ["train.schedule=linear"],  # linear decay (ours wsd)
    "warmup_4": ["train.warmup_steps=4"],  # (ours 30)
    "weight_decay": ["train.weight_decay=0.01"],  # AdamW's (Muon's is 0.1 in both)
}
PEER = list(DIFFERENCES)
SKIP = 3  # a timing run's first steps (setup, warm-up) are not timed


def overrides_of(variant: str) -> list[str]:
    """A variant's overrides: `baseline`, a DIFFERENCES key, `peer_all` (every peer difference)
    or several keys joined by `+`."""
    if variant == "baseline":
        return []
    parts = PEER if variant == "peer_all" else variant.split("+")
    unknown = [p for p in parts if p not in DIFFERENCES]
    if unknown:
        raise SystemExit(f"unknown variant part(s) {unknown}: use baseline, peer_all or "
                         f"{', '.join(DIFFERENCES)} joined by +")
    return [o for p in parts for o in DIFFERENCES[p]]


def data_overrides(args) -> list[str]:
    """The quickstart's data step in its own folder, its cache given `--cache-minutes` (the
    quickstart's 3 cache a few dozen conversations on a busy 2-core machine), and the held-out
    share that keeps about as many conversations out as the issue's 17."""
    return [f"data.out_dir={args.data_dir}", f"data.cache.max_minutes={args.cache_minutes:g}",
            f"train.eval_fraction={args.eval_fraction:g}"]


def train(args, variant: str, steps: int, out_dir: Path) -> list[dict]:
    """One `draftsmith train` of the quickstart recipe for `steps` steps; its metrics rows."""
    command = [sys.executable, "-m", "draftsmith", "train", "--config", RECIPE,
               *data_overrides(args),
               *overrides_of(variant), f"train.max_steps={steps}",
               "train.max_minutes=null", "train.save_every=0", f"train.output_dir={out_dir}"]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save(path: Path, payload: dict) -> None:
    payload.update(recipe=RECIPE, commit=git_commit(),
                   hardware=describe_hardware(hardware_record("cpu")))
    write_json(path, payload)


def time_variants(args, payload: dict) -> None:
    """Seconds per step of each variant, `--rounds` interleaved runs of TIMED_STEPS steps."""
    per_step: dict[str, list[float]] = {}
    for round_index in range(args.rounds):
        for variant in args.variants:
            rows = train(args, variant, args.timed_steps,
                         Path(args.work) / "time" / f"{variant}-{round_index}")
            clock = [r["seconds"] for r in rows if "loss" in r]
            per_step.setdefault(variant, []).extend(
                b - a for a, b in zip(clock[SKIP - 1:], clock[SKIP:], strict=False))
    timing = payload.setdefault("seconds_per_step", {})
    for variant, deltas in per_step.items():
        timing[variant] = {"median": round(statistics.median(deltas), 4),
                           "mean": round(statistics.fmean(deltas), 4), "steps_timed": len(deltas),
                           "rounds": args.rounds}


def relative_cost(variant: str, timing: dict) -> float:
    """A variant's seconds per step over the baseline's, from the interleaved timing run: its own,
    else that of the timed variant with the same compute (only a frozen head and the norms change
    what a step computes); 1 before any timing."""
    parts = set() if variant == "baseline" else \
        set(PEER if variant == "peer_all" else variant.split("+"))
    same = {frozenset(): "baseline", frozenset({"frozen_head"}): "frozen_head",
            frozenset({"norms"}): "norms", frozenset({"frozen_head", "norms"}): "peer_all"}
    timed = variant if variant in timing else same[frozenset({"frozen_head", "norms"} & parts)]
    if timed == "baseline" or not timing:
        return 1.0
    return timing[timed]["median"] / timing["baseline"]["median"]


def train_variants(args, payload: dict) -> None:
    """Each variant for the steps that fit the baseline's minutes at its relative cost; its final
    held-out evaluation, written next to its run (`report` gathers them)."""
    timing = payload.get("seconds_per_step", {})
    for variant in args.variants:
        cost = relative_cost(variant, timing)
        steps = args.steps or math.floor(args.base_steps / cost)
        out_dir = Path(args.work) / "train" / (args.name or variant)
        rows = train(args, variant, steps, out_dir)
        final = [r for r in rows if "eval/simulated_tau" in r][-1]
        write_json(out_dir / "result.json", {
            "variant": variant, "overrides": overrides_of(variant), "steps": steps,
            "relative_cost": round(cost, 4),
            "base_steps": args.base_steps, "drafter": str(out_dir / "drafter"),
            "data": data_overrides(args),
            **{f"heldout_acc@{k + 1}": round(final[f"eval/acc_{k}"], 4) for k in range(3)},
            "heldout_simulated_tau": round(final["eval/simulated_tau"], 4)})


FIRST_PASS = (21, 31)  # steps whose batches no run had seen (140 train conversations, 4 a step)


def first_pass(metrics: Path) -> dict:
    """A run's accuracy per draft position on its steps FIRST_PASS (each batch scored before the
    step trains on it, the same batches in every run: unseen conversations, a paired comparison),
    and its median seconds per step from step 4 (all runs side by side on one busy machine)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    window = rows[FIRST_PASS[0]:FIRST_PASS[1]]
    clock = [r["seconds"] for r in rows[2:FIRST_PASS[1]]]
    return {"steps_done": len(rows),
            "seconds_per_step_side_by_side": round(statistics.median(
                b - a for a, b in itertools.pairwise(clock)), 1),
            **{f"first_pass_acc@{k + 1}": round(statistics.fmean(r[f"acc_{k}"] for r in window), 4)
               for k in range(3)}} if len(window) == FIRST_PASS[1] - FIRST_PASS[0] else {}


def report(args, payload: dict) -> None:
    """Gather every trained variant's result into the payload; print the markdown table."""
    payload["first_pass"] = {
        path.parent.name: first_pass(path)
        for path in sorted((Path(args.work) / "train").glob("*/metrics.jsonl"))}
    for path in sorted((Path(args.work) / "train").glob("*/result.json")):
        tau = load(path.parent / "tau.json")
        payload.setdefault("variants", {})[path.parent.name] = {
            **load(path), **({"decoded_tau": tau} if tau else {})}
    rows = sorted(payload.get("variants", {}).items(),
                  key=lambda item: -item[1]["heldout_simulated_tau"])
    print("| run | overrides | steps | held-out acc@1 | acc@2 | acc@3 | simulated tau | "
          "decoded tau |\n|---|---|---|---|---|---|---|---|")
    for name, row in rows:
        tau = row.get("decoded_tau", {}).get("tau", "-")
        print(f"| {name} | `{' '.join(row['overrides']) or '(the quickstart recipe)'}` | "
              f"{row['steps']} | {row['heldout_acc@1']:.3f} | {row['heldout_acc@2']:.3f} | "
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
    parser.add_argument("--name", default=None, help="train: the run's folder and label")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timed-steps", type=int, default=30)
    parser.add_argument("--base-steps", type=int, default=375,
                        help="the baseline's steps in the minutes compared (6 min at 0.958 s)")
    parser.add_argument("--limit", type=int, default=4, help="prompts per set (3 sets)")
    parser.add_argument("--tree-total-tokens", default="16")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--work", default="runs/peer-recipe")
    parser.add_argument("--data-dir", default="runs/peer-recipe/data")
    parser.add_argument("--cache-minutes", type=float, default=17.0)
    parser.add_argument("--eval-fraction", type=float, default=0.1)
    parser.add_argument("--out", default="benchmarks/peer-recipe/results.json")
    args = parser.parse_args()
    payload = load(Path(args.out))
    phases = {"time": time_variants, "train": train_variants, "report": report,
              "tau": tau_variants}
    phases[args.phase](args, payload)
    if args.phase in ("time", "report"):
        save(Path(args.out), payload)


if __name__ == "__main__":
    main()
