"""Check `draftsmith plan` against a real run on this CPU: prepare the recipe's data (in its own
process, so that loading the source does not count), train the recipe in a fresh process that
reports its peak RSS, and write the plan's CPU figure beside it.

    python benchmarks/plan/plan_check.py RECIPE [section.key=value ...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path


def prepare(recipe_path: str, overrides: list[str]) -> None:
    from draftsmith.data.pipeline import run_data_recipe
    from draftsmith.train.recipe import load_recipe

    run_data_recipe(load_recipe(recipe_path, overrides).data_recipe, progress=False)


def train(recipe_path: str, overrides: list[str]) -> None:
    """`draftsmith train` less the data pipeline (already run): the same loading and loop."""
    from draftsmith.draft_vocab.file import read_draft_vocab
    from draftsmith.train.loop import make_accelerator, run_training
    from draftsmith.train.recipe import load_recipe
    from draftsmith.train.run import read_tokenized

    recipe = load_recipe(recipe_path, overrides)
    accelerator = make_accelerator(recipe)
    target = recipe.target.load(device=str(accelerator.device))
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = Path(recipe.data["out_dir"])
    examples = read_tokenized(out / "tokenized.jsonl")
    vocab = read_draft_vocab(out / "draft_vocab.safetensors",
                             int(target.model.config.get_text_config().vocab_size))
    start = time.perf_counter()
    run_training(recipe, examples, target=target.model, accelerator=accelerator,
                 draft_vocab=vocab)
    print(json.dumps({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "rss_after_target_load_bytes": loaded,
                      "train_seconds": round(time.perf_counter() - start, 1)}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", default="benchmarks/plan/smollm2-135m-cpu.json")
    parser.add_argument("--step", choices=["prepare", "train"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.recipe, args.overrides)
        return 0
    if args.step == "train":
        train(args.recipe, args.overrides)
        return 0

    from draftsmith.plan.report import format_report, plan_recipe

    base = [sys.executable, __file__, args.recipe, *args.overrides, "--step"]
    subprocess.run([*base, "prepare"], check=True)
    done = subprocess.run([*base, "train"], check=True, capture_output=True, text=True)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    report = plan_recipe(args.recipe, args.overrides, gpu="cpu")  # every position computed
    plans = {"plan": {"peak_bytes": report.plan.peak,
                      "terms": {t.name: t.bytes for t in report.plan.terms},
                      "report": format_report(report)}}
    peak = measured["peak_rss_bytes"]
    result = {
        "recipe": args.recipe, "overrides": args.overrides, "cpu": _cpu(),
        "python": platform.python_version(), "torch": _version("torch"), "measured": measured,
        "plan": plans,
        "plan_over_measured": {k: round(v["peak_bytes"] / peak, 3) for k, v in plans.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(plans["plan"]["report"])
    print(f"measured peak RSS {peak / 1e9:.2f} GB; plan {result['plan_over_measured']} x "
          f"measured; written {args.out}")
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())
