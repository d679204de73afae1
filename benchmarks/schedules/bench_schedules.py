"""Which learning-rate schedule a short run should use: the same recipe trained with each of
`cosine`, `wsd` and `constant` for the same steps, held-out accuracy per draft position and
simulated tau compared, written to a JSON file (a benchmark, not a test).

    .venv/bin/python benchmarks/schedules/bench_schedules.py \
        --recipe recipes/smollm2-135m/quickstart.yaml --steps 80 \
        --out benchmarks/schedules/quickstart-eagle3.json [section.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.target.precision import describe_hardware, hardware_record
from draftsmith.train.budget import SCHEDULES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="recipes/smollm2-135m/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--work", default="runs/bench_schedules")
    parser.add_argument("--out", default="benchmarks/schedules/quickstart-eagle3.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results = {}
    for schedule in SCHEDULES:
        out_dir = Path(args.work) / schedule
        command = [sys.executable, "-m", "draftsmith", "train", "--config", args.recipe,
                   *args.overrides, f"train.schedule={schedule}", f"train.max_steps={args.steps}",
                   "train.max_minutes=null", "train.save_every=0", f"train.output_dir={out_dir}"]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)
        rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
        final = [r for r in rows if "eval/simulated_tau" in r][-1]
        results[schedule] = {k.removeprefix("eval/"): round(v, 4) for k, v in final.items()
                             if k.startswith("eval/")}
    best = max(results, key=lambda s: results[s]["simulated_tau"])
    payload = {"recipe": args.recipe, "overrides": args.overrides, "steps": args.steps,
               "results": results, "best": best, "commit": git_commit(),
               "hardware": describe_hardware(hardware_record("cpu"))}
    write_json(args.out, payload)
    print(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
