"""Seconds per drafter step (forward + loss + backward) and host reads per step of every kind, at
the quickstart's shapes, for the loss code at two checkouts, alternated kind by kind (a
benchmark, not a test).

    git worktree add /tmp/before <commit before the change>
    git worktree add /tmp/after <commit of the change>
    flock /tmp/draftsmith-bench.lock .venv/bin/python \\
        benchmarks/train_step/bench_models_host_reads.py --before /tmp/before --after /tmp/after \\
        --out benchmarks/train_step/models-host-reads.json

Each measurement runs in a fresh process whose `draftsmith` is the checkout's (PYTHONPATH). The
target is SmolLM2-135M's shape (hidden 576, 9 heads / 3 KV heads, vocab 49,152, 30 layers) with
random weights; its features are random tensors of that shape (the target's own forward is not
timed). Batch 8 x 512 as recipes/smollm2-135m/eagle3.yaml, right-padded rows of 256..512 real
tokens whose first 32..128 (the prompt) are not trained. Drafter settings are the smollm2-135m
recipes' (recipes/smollm2-135m/<kind>.yaml; Medusa's is medusa1.yaml). A first step on one sequence, under a dispatch mode that counts `_local_scalar_dense`,
`nonzero`, `masked_select` and boolean-mask indexing, is the warm-up and the read count; the
next `--steps` of the full batch are timed, in wall seconds and in the process's CPU seconds
(both threads), the latter steadier on a machine that others load too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m"
KINDS = {"eagle1": "eagle1", "eagle3": "eagle3", "medusa": "medusa1", "mtp": "mtp",
         "dflash": "dflash", "dspark": "dspark"}  # kind -> its recipe's drafter settings
SHAPE = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
         "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
         "max_position_embeddings": 8192, "tie_word_embeddings": True}
BATCH, LENGTH = 8, 512


def _reads_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    reads = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default}
    indexing = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}

    class Reads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            masks = func in indexing and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())
            if func in reads or masks:
                self.counts[str(func)] += 1
            return func(*args, **(kwargs or {}))

    return Reads()


def synthetic_masks(gen, size: int):
    """(input_ids, attention_mask, loss_mask) (size, LENGTH): 256..512 real tokens a row, the
    first 32..128 an untrained prompt."""
    import torch

    lengths = torch.randint(256, LENGTH + 1, (size,), generator=gen)
    prompts = torch.randint(32, 129, (size,), generator=gen)
    index = torch.arange(LENGTH)[None]
    attention_mask = (index < lengths[:, None]).long()
    loss_mask = attention_mask * (index >= prompts[:, None])
    return torch.randint(2, 8192, (size, LENGTH), generator=gen) * attention_mask, \
        attention_mask, loss_mask


def eagle3_rows() -> str:
    """Rows EAGLE-3's row-wise parts compute on the timed batch: packed (the old step: real
    tokens at step 0, positions trained at that step or later after, heads on trained rows)
    against every position (the new step), as a Markdown table."""
    import torch

    from draftsmith.models.eagle3 import ttt_rows
    from draftsmith.models.layers import shift_left

    steps = recipe_settings("eagle3")["ttt_steps"]
    gen = torch.Generator().manual_seed(1)  # as the worker draws: the counted sequence first
    synthetic_masks(gen, 1)
    for _ in range(4):  # its last hidden state and three fused layers
        torch.randn(1, LENGTH, SHAPE["hidden_size"], generator=gen)
    _, attention_mask, loss_mask = synthetic_masks(gen, BATCH)
    index = torch.arange(LENGTH)[None]
    valid = [(shift_left(loss_mask, 2 + j) > 0) & (index < LENGTH - 2 - j) for j in range(steps)]
    counts = [(sum(int(n.sum()) for n in ttt_rows(attention_mask, valid)), BATCH * LENGTH * steps),
              (sum(int(v.sum()) for v in valid), sum(BATCH * (LENGTH - 2 - j)
                                                     for j in range(steps))),
              (int((shift_left(loss_mask, 1) > 0).sum()), BATCH * LENGTH)]
    lines = [f"real tokens {int(attention_mask.sum()):,}, trained {int(loss_mask.sum()):,} of "
             f"{BATCH * LENGTH:,}", "",
             f"| EAGLE-3, {steps} TTT steps | rows before | rows after | ratio |",
             "|---|---|---|---|"]
    for name, (before, after) in zip(("decoder layer (all steps)", "draft head (all steps)",
                                      "target head (once)"), counts, strict=True):
        lines.append(f"| {name} | {before:,} | {after:,} | {after / before:.2f} |")
    return "\n".join(lines) + "\n"


def recipe_settings(kind: str) -> dict:
    """The drafter section of the kind's smollm2-135m recipe, without `kind`."""
    import yaml

    drafter = yaml.safe_load((RECIPES / f"{KINDS[kind]}.yaml").read_text())["drafter"]
    return {key: value for key, value in drafter.items() if key != "kind"}


def worker(kind: str, dtype_name: str, steps: int) -> dict:
    """One kind at one precision in this process's `draftsmith`."""
    import torch
    from torch import nn
    from transformers import LlamaConfig

    from draftsmith.models.features import Features
    from draftsmith.registry import get_spec

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE)
    spec = get_spec(kind)
    settings = spec.make_config(recipe_settings(kind))
    bf16 = dtype_name == "bf16"
    feature_dtype = torch.bfloat16 if bf16 else torch.float32
    embed = nn.Embedding(config.vocab_size, config.hidden_size)
    head = nn.Linear(config.hidden_size, config.vocab_size, bias=False).to(feature_dtype)
    head.weight.data = embed.weight.data.to(feature_dtype) * 4
    target = type("Target", (), {"config": config, "get_input_embeddings": lambda self: embed,
                                 "get_output_embeddings": lambda self: head})()
    drafter = spec.build(config, settings)
    drafter.init_from_target(target)
    drafter.train()
    gen = torch.Generator().manual_seed(1)
    layers = spec.aux_layers(config.num_hidden_layers, settings)

    def batch(size):
        input_ids, attention_mask, loss_mask = synthetic_masks(gen, size)

        def hidden():
            return torch.randn(size, LENGTH, config.hidden_size, generator=gen).to(feature_dtype)

        return Features(input_ids, attention_mask, loss_mask, hidden(),
                        [hidden() for _ in layers], head)

    def step(features):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = spec.loss(drafter, features)
        loss.backward()
        drafter.zero_grad(set_to_none=True)

    reads = _reads_mode()
    with reads:  # the count, and the warm-up, on one sequence
        step(batch(1))
    counted = {"host_reads": sum(reads.counts.values()), "reads_by_op": dict(reads.counts)}
    if steps == 0:  # --count-only
        return counted
    batches = [batch(BATCH) for _ in range(steps)]
    wall, cpu = time.perf_counter(), time.process_time()
    for features in batches:
        step(features)
    return {"seconds_per_step": (time.perf_counter() - wall) / steps,
            "cpu_seconds_per_step": (time.process_time() - cpu) / steps, **counted}


def run(checkout: Path, kind: str, dtype: str, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    script = str(Path(__file__).resolve())
    out = subprocess.run([sys.executable, script, "--worker", kind, dtype, str(steps)],
                         env=env, check=True, capture_output=True, text=True, cwd=checkout)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(record: dict) -> str:
    """The record's rows as a Markdown table (s/step where timed, reads always)."""
    def seconds(run, key):
        return f"{run[key]:.2f}" if key in run else "-"

    lines = ["| kind | dtype | wall s/step before | after | CPU s/step before | after | "
             "host reads before | after |", "|---|---|---|---|---|---|---|---|"]
    for row in record["rows"]:
        before, after = row["before"], row["after"]
        lines.append(f"| {row['kind']} | {row['dtype']} | {seconds(before, 'seconds_per_step')} | "
                     f"{seconds(after, 'seconds_per_step')} | "
                     f"{seconds(before, 'cpu_seconds_per_step')} | "
                     f"{seconds(after, 'cpu_seconds_per_step')} | {before['host_reads']} | "
                     f"{after['host_reads']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="checkout of the old code (required)")
    parser.add_argument("--after", type=Path, default=Path.cwd())
    parser.add_argument("--steps", type=int, default=1,
                        help="timed steps per measurement; 0 counts the reads only (no lock "
                        "needed: nothing is timed)")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS))
    parser.add_argument("--dtypes", nargs="*", default=["fp32", "bf16"])
    parser.add_argument("--out", type=Path, help="the JSON written (required)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--table", type=Path, help="print a written JSON's Markdown table")
    parser.add_argument("--rows", action="store_true",
                        help="print the rows EAGLE-3's old and new steps compute on this batch")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())), end="")
        return
    if args.rows:
        print(eagle3_rows(), end="")
        return
    if args.worker:
        kind, dtype, steps = args.worker
        print(json.dumps(worker(kind, dtype, int(steps))))
        return
    if args.before is None or args.out is None:
        parser.error("--before and --out are required")
    commits = {name: subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip()
               for name, path in (("before", args.before), ("after", args.after))}
    record = {"batch": BATCH, "length": LENGTH, "target_shape": SHAPE,
              "settings": {kind: recipe_settings(kind) for kind in args.kinds},
              "steps": args.steps, "commits": commits,
              "hardware": "AMD EPYC Zen 4 (avx512_bf16, no AMX), 2 cores", "rows": []}
    for dtype in args.dtypes:
        for kind in args.kinds:
            before = run(args.before.resolve(), kind, dtype, args.steps)
            after = run(args.after.resolve(), kind, dtype, args.steps)
            record["rows"].append({"kind": kind, "dtype": dtype, "before": before,
                                   "after": after})
            args.out.write_text(json.dumps(record, indent=2) + "\n")  # each row as it lands
            print(kind, dtype, f"{before.get('cpu_seconds_per_step')} -> "
                  f"{after.get('cpu_seconds_per_step')} CPU s/step, reads "
                  f"{before['host_reads']} -> {after['host_reads']}", flush=True)


if __name__ == "__main__":
    main()
