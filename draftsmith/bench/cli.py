"""`draftsmith bench --config recipes/bench/T.yaml [...]`: run the benchmark of each target
(stages resume), then regenerate BENCHMARKS.md and its plots from every target's bench.json."""

from __future__ import annotations

import argparse
from pathlib import Path

STAGES = ("data", "train", "eval", "engine")


def add_bench_parser(verbs) -> None:
    bench = verbs.add_parser("bench", help="train every drafter kind under one budget and compare "
                             "them with the baselines; writes BENCHMARKS.md")
    bench.add_argument("--config", action="append", required=True,
                       help="benchmark config (recipes/bench/*.yaml); repeat for several targets")
    bench.add_argument("--stages", default=",".join(STAGES),
                       help="comma list of data, train, eval, engine (each resumes; engine: the drafters in "
                       "real serving engines); none = report only")
    bench.add_argument("--device", default=None,
                       help="cpu | cuda | cuda:N | auto: where every stage computes (default: "
                       "each config's `device`, itself auto: a GPU when one is visible)")
    bench.add_argument("--report", default="BENCHMARKS.md",
                       help="markdown file to regenerate from the results")
    bench.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from draftsmith.bench.config import load_bench_config
    from draftsmith.bench.report import earlier_benches, write_benchmarks
    from draftsmith.bench.run import run_bench
    from draftsmith.errors import DraftsmithError
    from draftsmith.eval.results import read_bench_results

    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip() and s != "none")
    bad = sorted(set(stages) - set(STAGES))
    if bad:
        raise DraftsmithError(f"unknown stage(s) {bad}; choose from {', '.join(STAGES)}")
    # all checked before any work
    configs = [load_bench_config(path, args.device) for path in args.config]
    benches, measured = [], set()
    for config in configs:
        path = run_bench(config, stages)
        bench = read_bench_results(path)
        name = config.name or config.target
        if not (bench.eval or bench.passes):
            # a data, train or engine stage alone: the committed results stay (replacing them
            # would delete every evaluation file of the last full run)
            print(f"{name}: no evaluation results in {config.out_dir} yet, so BENCHMARKS.md and "
                  f"benchmarks/{name}/ keep the committed run (add `eval` to --stages to replace "
                  "them)")
            continue
        benches.append((bench, Path(config.out_dir)))
        measured.add(name)
    benches += earlier_benches(measured)
    # every section's config, this run's and those kept from earlier runs
    paths = dict.fromkeys([*(c.path for c in configs),
                           *(b.config.get("path") for b, _ in benches)])
    preamble = ["Reproduce: `bash scripts/bench.sh` (resumable; each stage skips finished work). "
                "Per-target configs: " + ", ".join(f"`{p}`" for p in paths if p) + "."]
    others = tuple(sorted(Path("benchmarks").glob("machine-*/verify_cost.json")))
    out = write_benchmarks(benches, Path(args.report), Path("benchmarks/overhead.json"), preamble,
                           Path("benchmarks/machine/verify_cost.json"), others)
    print(f"wrote {out}")
    return 0
