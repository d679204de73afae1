"""Training ablation at equal wall-clock (EAGLE-3 by default, any bench entry with `--kind`, e.g.
dflash): the benchmark's recipe of that entry and its data trained once per arm (baseline,
EAGLE-3.1, each loss, D-PACE, Muon; a block drafter's anchors per sequence) for the same
`train.max_minutes`, held-out accuracy at draft positions 1-3 and simulated tau, then the best
`--eval-best` arms and the baseline decoded side by side in one greedy run of the benchmark's
evaluation (its prompt sets, limit, tokens and dynamic tree): tau and speedup. All written to one
JSON file (a benchmark, not a test; run it on an otherwise idle machine: the arms share its
clock).

    .venv/bin/python benchmarks/ablation/bench_ablation.py --minutes 7 \
        --out benchmarks/ablation/smollm2-135m-eagle3.json [--arms baseline,muon] [--eval-best 2] \
        [--data-override data.limit=64 ...] [section.key=value ...]

Layout under `--work`: data/ (shared), train/ARM/ (each arm's run), ARM.yaml, eval/eval.json.

The data is the benchmark's shared preparation (`--bench`'s `data:` recipe into `--work`/data,
resumed and reused by every arm; a link `--work`/data to the benchmark's own data folder reuses
that); `--data-override`s change that data recipe (a smoke run:
`data.regenerate=null data.limit=64 data.cache.max_minutes=1`). Every arm trains
`--bench`'s `--kind` entry with its `train:` settings, `train.max_minutes=--minutes`, then its own
overrides; trailing `section.key=value`s apply to every arm. A finished arm is not trained again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import yaml

from draftsmith.bench.config import load_bench_config
from draftsmith.bench.run import kind_recipe, prepare_data
from draftsmith.config_values import apply_overrides, read_yaml_mapping
from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.target.precision import describe_hardware, hardware_record
from draftsmith.train.metrics import metrics_rows
from draftsmith.train.recipe import build_recipe, recipe_schema

# every arm starts from AdamW (the recipes now choose Muon from this ablation; the baseline stays
# what it measured against)
BASE = ["train.optimizer=adamw"]
ARMS = {
    "baseline": [],
    "eagle3.1": ["drafter.fc_norm=true", "drafter.norm_output=true"],
    "tv": ["drafter.loss=tv"],
    "lk": ["drafter.loss=lk"],
    "ce": ["drafter.loss=ce"],
    "ce+tv": ["drafter.loss={ce: 0.1, tv: 0.9}"],
    "ce+dpace": ["drafter.loss=ce", "drafter.position_weights=dpace"],
    "muon": ["train.optimizer=muon"],
    # block drafters: blocks per sequence, so trained rows per cached feature against steps (48
    # blocks of 8 cover a 384-token sequence once; a step's cost grows with the blocks)
    "anchors16": ["drafter.anchors_per_sequence=16"],
    "anchors48": ["drafter.anchors_per_sequence=48"],
    # block length: block 4 trains 3 proposals per block (the autotuned trees decode 2-3 deep on
    # a CPU), so twice the blocks (depth-1 examples) for the same rows as 32 blocks of 8
    "block4": ["drafter.block_size=4", "drafter.anchors_per_sequence=64"],
    "block4x128": ["drafter.block_size=4", "drafter.anchors_per_sequence=128"],
    "block4x32": ["drafter.block_size=4", "drafter.anchors_per_sequence=32"],
    # block drafters' position weights: decay (exp(-(k-1)/gamma), the default) leaves positions
    # 2-3 at 0.61 / 0.37 of position 1's weight for block 4; uniform and D-PACE weigh them more
    "uniform": ["drafter.position_weights=uniform"],
    "dpace": ["drafter.position_weights=dpace"],
    # one draft layer (EAGLE-3's depth): half the drafter's forward, in training and decoding
    "block4l1": ["drafter.block_size=4", "drafter.anchors_per_sequence=64", "drafter.num_layers=1"],
}
POSITIONS = 3  # acc@1..3: the first three draft positions


def arm_result(folder: Path) -> dict:
    """What one arm's metrics.jsonl says: held-out accuracy, simulated tau, steps, tokens."""
    rows = [row for _, row in metrics_rows(folder / "metrics.jsonl")]
    final = [r for r in rows if "eval/simulated_tau" in r][-1]
    steps = [r for r in rows if "loss" in r]
    return {
        **{f"acc@{k + 1}": round(final[f"eval/acc_{k}"], 4) for k in range(POSITIONS)
           if f"eval/acc_{k}" in final},
        "simulated_tau": round(final["eval/simulated_tau"], 4),
        "steps": len(steps),
        "tokens_seen": sum(r.get("tokens", 0) for r in steps),
        "train_seconds": round(steps[-1]["seconds"], 1) if steps else None,
    }


def eval_label(arm: str) -> str:
    """An arm's name as a drafter label in method names (`ce+tv` -> `ce_tv`)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in arm)


def evaluate_arms(config, entry, work: Path, arms: list[str]) -> dict:
    """The arms' drafters in one greedy run of the benchmark's evaluation (dynamic tree, the
    benchmark's sets, limit and tokens), next to plain decoding; mean tau and speedup over sets."""
    from draftsmith.bench.run import run_eval_stage

    labels = {eval_label(arm): arm for arm in arms}
    for label, arm in labels.items():  # run_eval_stage reads OUT/train/LABEL/drafter
        link = work / "train" / label
        if label != arm and not link.exists():
            link.symlink_to(arm)
    kinds = [replace(entry, label=label) for label in labels]
    methods = tuple(f"drafter_dynamic@{label}" for label in labels)
    result = run_eval_stage(replace(config, kinds=kinds), work / "eval", methods, print,
                       temperature=0.0)
    sets = result["summary"]
    means = {}
    for method, arm in zip(methods, labels.values(), strict=True):
        rows = [sets[name][method] for name in sets if name != "all" and method in sets[name]]
        means[arm] = {"eval_tau": round(sum(r["tau"] for r in rows) / len(rows), 3),
                      "eval_speedup": round(sum(r["speedup"] for r in rows) / len(rows), 3),
                      "eval_runs": sum(r["runs"] for r in rows)}
    return means


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", default="recipes/bench/smollm2-135m.yaml")
    parser.add_argument("--kind", default="eagle3", help="the bench entry trained by every arm")
    parser.add_argument("--minutes", type=float, default=7.0, help="train.max_minutes per arm")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
    parser.add_argument("--eval-best", type=int, default=2,
                        help="decode the best N arms (by simulated tau) and the baseline (0: none)")
    parser.add_argument("--work", default="runs/bench_ablation")
    parser.add_argument("--out", default="benchmarks/ablation/smollm2-135m-eagle3.json")
    parser.add_argument("--data-override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    work = Path(args.work)
    config = load_bench_config(args.bench)
    entry = next((e for e in config.kinds if e.label == args.kind), None)
    if entry is None:
        parser.error(f"{args.bench} has no kind {args.kind!r}")
    data_recipe = read_yaml_mapping(config.data, "data recipe", "see recipes/data/")
    apply_overrides(data_recipe, args.data_override)
    work.mkdir(parents=True, exist_ok=True)
    (work / "data_recipe.yaml").write_text(yaml.safe_dump(data_recipe, sort_keys=False))
    config = replace(config, data=str(work / "data_recipe.yaml"), out_dir=str(work))
    prepare_data(config)

    results = {}
    for arm in arms:
        out_dir = work / "train" / arm
        raw = kind_recipe(config, entry, max_minutes=args.minutes, max_steps=100_000,
                          save_every=0, eval_every=0, output_dir=str(out_dir))
        apply_overrides(raw, [*BASE, *ARMS[arm], *args.overrides], recipe_schema)
        if raw["train"].get("optimizer") != "muon":  # the recipe's Muon rate: the muon arm's
            raw["train"].pop("muon_lr", None)
        build_recipe(raw)  # a bad override fails here, before any training
        recipe_path = work / f"{arm}.yaml"
        recipe_path.write_text(yaml.safe_dump(raw, sort_keys=False))
        command = [sys.executable, "-m", "draftsmith.train", "--config", str(recipe_path)]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)  # a finished arm returns at once
        results[arm] = {"overrides": ARMS[arm], **arm_result(out_dir)}
        print(arm, json.dumps(results[arm]), flush=True)
    best = sorted(results, key=lambda a: -results[a]["simulated_tau"])
    decoded = best[:args.eval_best] + (["baseline"] if "baseline" in results else [])
    if args.eval_best > 0:
        for arm, numbers in evaluate_arms(config, entry, work, list(dict.fromkeys(decoded))).items():
            results[arm].update(numbers)
    payload = {"bench": args.bench, "kind": args.kind, "minutes_per_arm": args.minutes,
               "data_overrides": args.data_override, "overrides": args.overrides,
               "results": results, "by_simulated_tau": best, "commit": git_commit(),
               "hardware": describe_hardware(hardware_record("cpu"))}
    write_json(args.out, payload)
    print(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
