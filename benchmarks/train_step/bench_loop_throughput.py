"""Training-loop throughput before and after a change, on the same machine in the same run: real
tokens trained per second, the padding share of the tokens the step computes, seconds per step
(wall clock and process CPU) and host scalar reads per step, for one recipe with online features
and with cached features (a benchmark, not a test). Run it on a quiet machine: beside other work
the arm that keeps both cores busier loses more (the second Xeon pass in README.md measured 1.31x
beside tests where a quiet machine measures 1.08x), and the load average each run saw is recorded.

    flock /tmp/draftsmith-bench.lock .venv/bin/python \\
        benchmarks/train_step/bench_loop_throughput.py --before /tmp/before-loop --after . \\
        --steps 6 --rounds 2 --out benchmarks/train_step/loop-throughput.json -- \\
        --config recipes/smollm2-135m/quickstart.yaml data.out_dir=DATA ...

Each arm is a checkout (`git worktree add /tmp/before-loop COMMIT`) run with this venv's python
from its own folder (its `draftsmith` first on the path). Runs alternate before/after, offline
then online, `--rounds` times. A run trains `--steps` optimizer steps (`train.max_steps`, no time
budget, no checkpoints); the first step (allocation, first touches) is left out of the timings and
the last one is counted: `_micro_step`/`_end_step` under a dispatch mode that counts
`_local_scalar_dense`, `nonzero`, `masked_select`, boolean-mask indexing and `tolist`/`numpy`
(reads of torch.optim's host step counters and the DataLoader's host seed left out: no device
waits on them). Timings come from the loop's one clock read per step (`time.perf_counter` in
train/loop.py), recorded with the process CPU time beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

MODES = ("offline", "online")


def child(args, overrides: list[str]) -> None:
    """One training run in this process (the arm's checkout first on sys.path): per-step clocks,
    padded and real tokens, and the last step's host reads written to `args.child_out`."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    import draftsmith.train.loop as loop
    from draftsmith.train.loss_module import LossModule
    from draftsmith.train.run import train_from_recipe

    record = {"clock": [], "padded": [], "real": [], "reads": Counter()}
    wall = time.perf_counter

    class Clock:  # the loop's `time`: perf_counter recorded with the process CPU time
        @staticmethod
        def perf_counter():
            now = wall()
            record["clock"].append((now, time.process_time()))
            return now

    loop.time = Clock
    forward = LossModule.forward

    def counted_forward(self, batch):
        was, counting[0] = counting[0], False  # the benchmark's own read is not the loop's
        record["padded"].append(batch["input_ids"].numel())
        record["real"].append(int(batch["attention_mask"].sum()))
        counting[0] = was
        return forward(self, batch)

    counting = [False]
    aten = torch.ops.aten
    reads = {aten._local_scalar_dense.default, aten.item.default, aten.nonzero.default,
             aten.masked_select.default}
    indexing = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}

    def count(name):
        host = ("torch/optim/", "torch/utils/data/")
        if counting[0] and not any(h in f.filename for f in traceback.extract_stack()
                                   for h in host):
            record["reads"][name] += 1

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            if func in reads or (func in indexing and any(
                    isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in a[1] or ())):
                count(str(func))
            return func(*a, **(kw or {}))

    class Copies(TorchFunctionMode):
        def __torch_function__(self, func, types, a=(), kw=None):
            if func in (torch.Tensor.tolist, torch.Tensor.numpy):
                count(func.__name__)
            return func(*a, **(kw or {}))

    def counted(method):
        def run(self, *a, **kw):
            if self.step < args.steps - 1:
                return method(self, *a, **kw)
            counting[0] = True
            try:
                with Reads(), Copies():
                    return method(self, *a, **kw)
            finally:
                counting[0] = False
        return run

    LossModule.forward = counted_forward
    loop.Trainer._micro_step = counted(loop.Trainer._micro_step)
    loop.Trainer._end_step = counted(loop.Trainer._end_step)
    train_from_recipe(args.config, overrides)
    Path(args.child_out).write_text(json.dumps({**record, "reads": dict(record["reads"])}))


def padding(args, overrides: list[str], epochs: int = 3) -> dict:
    """Padding share of every batch of `epochs` epochs of the recipe's data, `rows` (random
    pairs: the plan before token batches, unchanged) against `tokens` and `packed`, in memory
    (online) and streamed from the cache (offline); from the working tree's code, no
    training."""
    from types import SimpleNamespace

    from draftsmith.data.cache_reader import FeatureCache
    from draftsmith.train.batching import ExampleBatches
    from draftsmith.train.cache_stream import CacheStream
    from draftsmith.train.recipe import load_recipe
    from draftsmith.train.run import read_tokenized

    recipe = load_recipe(args.config, overrides)
    out_dir = Path(recipe.data_recipe.data.out_dir)
    examples = read_tokenized(out_dir / "tokenized.jsonl")
    cache = FeatureCache.open(out_dir / "cache")
    one = SimpleNamespace(num_processes=1, process_index=0, prepare=lambda loader: loader)
    shares = {}
    for batching in ("rows", "tokens", "packed"):
        cfg = recipe.train.__class__(**{**recipe.train.__dict__, "batching": batching})
        sources = {"online": ExampleBatches(examples, cfg, one), "offline": CacheStream(
            cache, [], (), batch_size=cfg.batch_size, max_length=cfg.max_length, seed=cfg.seed,
            eval_fraction=cfg.eval_fraction, rank=0, world_size=1, window=cfg.cache_window,
            max_held=cfg.eval_max_samples, batching=batching, batch_tokens=cfg.token_budget)}
        for mode, data in sources.items():
            masks = [b["attention_mask"] for e in range(epochs) for b in data.train_batches(e)]
            real, padded = sum(int(m.sum()) for m in masks), sum(m.numel() for m in masks)
            shares[f"{mode}/{batching}"] = {"padding_share": 1 - real / padded,
                                            "batches": len(masks), "real_tokens": real}
    return {"epochs": epochs, "sequences": {"online": len(examples),
                                            "offline": cache.num_samples}, "shares": shares}


def summarize(raw: dict, steps: int) -> dict:
    """Steps 2..N of one run: its per-step clocks are `clock[1:steps + 1]` (clock[0]: start)."""
    ends = raw["clock"][1:steps + 1]
    timed = range(1, steps - 1)  # steps 2 .. N-1 end at ends[1 .. N-2]; step N counts reads
    wall = ends[steps - 2][0] - ends[0][0]
    cpu = ends[steps - 2][1] - ends[0][1]
    real = sum(raw["real"][i] for i in timed)
    padded = sum(raw["padded"][i] for i in timed)
    # per step: steady against another process taking the cores for a few steps
    per_step = sorted(raw["real"][i] / (ends[i][0] - ends[i - 1][0]) for i in timed)
    return {"real_tokens_per_s": real / wall, "real_tokens_per_cpu_s": real / cpu,
            "median_step_real_tokens_per_s": per_step[len(per_step) // 2],
            "s_per_step": wall / len(timed), "cpu_s_per_step": cpu / len(timed),
            "real_tokens_per_step": real / len(timed), "padding_share": 1 - real / padded,
            "scalar_reads_per_step": sum(raw["reads"].values()), "reads": raw["reads"]}


def table(record: dict) -> str:
    """Per features mode and arm: the median over the arm's runs of each timed column (each run
    in brackets for real tokens/s), the deterministic columns, and the load averages seen."""
    import statistics

    lines = ["| features | arm | real tokens/s (wall) | median step's real tokens/s | real tokens "
             "per CPU-s | s/step | real tokens/step | padding | host reads/step | load |",
             "|---" * 10 + "|"]
    for mode in MODES:
        for arm in ("before", "after"):
            runs = [r for r in record["runs"] if r["mode"] == mode and r["arm"] == arm]
            if not runs:
                continue

            def median(key, runs=runs):
                return statistics.median(r[key] for r in runs)

            each = ", ".join(f"{r['real_tokens_per_s']:.0f}" for r in runs)
            loads = [x for r in runs for x in r["load_average"]]
            lines.append(
                f"| {mode} | {arm} | {median('real_tokens_per_s'):.0f} ({each}) | "
                f"{median('median_step_real_tokens_per_s'):.0f} | "
                f"{median('real_tokens_per_cpu_s'):.0f} | {median('s_per_step'):.2f} | "
                f"{median('real_tokens_per_step'):.0f} | {median('padding_share'):.1%} | "
                f"{median('scalar_reads_per_step'):.0f} | {min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines) + "\n"


def run_arm(checkout: Path, mode: str, args, overrides: list[str], tag: str) -> dict:
    out = Path(f"/tmp/bench-loop-{tag}.json")
    command = [sys.executable, str(Path(__file__).resolve()), "--child-out", str(out),
               "--steps", str(args.steps), "--", "--config", args.config, *overrides,
               f"train.features={mode}", f"train.max_steps={args.steps}",
               "train.max_minutes=null", "train.save_every=0", "train.eval_every=0",
               f"train.warmup_steps={min(args.steps, 30)}",
               f"train.output_dir=/tmp/bench-loop-runs/{tag}"]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    subprocess.run(["rm", "-rf", f"/tmp/bench-loop-runs/{tag}"], check=True)
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tag} failed:\n{done.stderr[-3000:]}")
    return summarize(json.loads(out.read_text()), args.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path)
    parser.add_argument("--after", type=Path)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--append", action="store_true",
                        help="add these runs to --out's (one lock hold per mode: A/B either way)")
    parser.add_argument("--child-out")
    parser.add_argument("--padding", action="store_true",
                        help="print the padding shares of whole epochs (no training) and stop")
    parser.add_argument("--table", type=Path, help="print a written JSON's Markdown table")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.table:
        return print(table(json.loads(args.table.read_text())), end="")
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    config = rest.index("--config")
    args.config, overrides = rest[config + 1], rest[:config] + rest[config + 2:]
    if args.child_out:
        return child(args, overrides)
    if args.padding:
        return print(json.dumps(padding(args, overrides), indent=1))
    runs = json.loads(args.out.read_text())["runs"] if args.append else []
    for round_ in range(args.rounds):
        for mode in args.modes.split(","):
            arms = [("before", args.before), ("after", args.after)]
            for arm, checkout in arms if round_ % 2 == 0 else arms[::-1]:
                tag = f"{mode}-{arm}-{round_}"
                load = os.getloadavg()[0]
                result = {"arm": arm, "mode": mode, "round": round_,
                          **run_arm(checkout.resolve(), mode, args, overrides, tag),
                          "load_average": [load, os.getloadavg()[0]]}
                runs.append(result)
                print(json.dumps(result), flush=True)
                write(args, runs, overrides)


def write(args, runs: list[dict], overrides: list[str]) -> None:
    commits = {arm: subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], text=True,
                                   capture_output=True).stdout.strip()
               for arm, path in (("before", args.before), ("after", args.after))}
    args.out.write_text(json.dumps({
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count()},
        "config": args.config, "overrides": overrides, "steps": args.steps, "commits": commits,
        "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
