"""Seconds per drafter step (forward + loss + backward) and host reads per step of every kind, on
batches of real conversations planned as training plans them, for the loss code at two checkouts,
alternated kind by kind (a benchmark, not a test).

    git worktree add --detach /tmp/before <commit before the change>
    git worktree add --detach /tmp/after <commit of the change>
    flock /tmp/draftsmith-bench.lock .venv/bin/python \\
        benchmarks/train_step/bench_models_host_reads.py --before /tmp/before --after /tmp/after \\
        --data runs/quickstart/data --out benchmarks/train_step/models-host-reads.json

The batches are the data's (`tokenized.jsonl` of a data run: input ids and loss masks) cut to
`--max-length` and planned by this checkout's `train.batching` (`tokens`: length-bucketed
batches of at most `--budget` padded tokens; `rows`: `--batch-size` sequences paired at random,
right-padded), collated by `train/batching.py`; both arms get the same batches. Each measurement
runs in a fresh process whose `draftsmith` is the checkout's (PYTHONPATH). The target is
SmolLM2-135M's shape (hidden 576, 9 heads / 3 KV heads, vocab 49,152, 30 layers) with random
weights; its features are random tensors of each batch's shape (the target's own forward is not
timed), its choice after each position the data's next token, as an offline cache stores it
(the data's answers are the target's own greedy ones), and the drafters with a draft vocabulary
install the data run's (`draft_vocab.safetensors`), so the share of trained rows whose target
choice the draft vocabulary holds is the data's (98% on the quickstart's). Drafter settings are the smollm2-135m recipes' (recipes/smollm2-135m/<kind>.yaml;
Medusa's is medusa1.yaml). The first batch, under a dispatch mode that counts
`_local_scalar_dense`, `nonzero`, `masked_select` and boolean-mask indexing, is the warm-up and
the read count; the next `--steps` batches are timed, in wall seconds and in the process's CPU
seconds (both threads). A checkout that sets up host memory reuse and row buckets for CPU training
gets them here too (`as_training_runs`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "smollm2-135m"
KINDS = {"eagle1": "eagle1", "eagle3": "eagle3", "medusa": "medusa1", "mtp": "mtp",
         "dflash": "dflash", "dspark": "dspark", "peagle": "peagle"}  # kind -> its recipe
SHAPE = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
         "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
         "max_position_embeddings": 8192, "tie_word_embeddings": True}


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


def plan_batches(args, count: int) -> list[dict]:
    """The first `count` batches of the data's epoch 0 under `args.batching`, collated (input
    ids, attention and loss masks: (B, T) each)."""
    from draftsmith.models.layers import shift_left
    from draftsmith.train.batching import collate, token_batches
    from draftsmith.train.run import read_tokenized

    examples = read_tokenized(args.data / "tokenized.jsonl")
    lengths = [min(len(e["input_ids"]), args.max_length) for e in examples]
    rng = random.Random(f"{args.seed}:0:{args.batching}")
    if args.batching == "tokens":
        pool = 64 * max(1, args.budget // args.max_length)  # as train/batching.py plans
        plan = token_batches(lengths, args.budget, pool, rng)
    else:
        order = list(range(len(examples)))
        rng.shuffle(order)
        plan = [order[i:i + args.batch_size]
                for i in range(0, len(order) - args.batch_size + 1, args.batch_size)]
    if len(plan) < count:
        raise SystemExit(f"{args.data} gives {len(plan)} batches; --steps asks for {count - 1} "
                         "timed after one warm-up: lower --steps or use more data")
    batches = [collate([examples[i] for i in b], args.max_length) for b in plan[:count]]
    for batch in batches:  # the target's choice after each position, as the cache stores it:
        # the data's next token (the data's answers are the target's own greedy ones)
        batch["target_argmax"] = shift_left(batch["input_ids"], 1)
    return batches


def draft_vocab(data: Path) -> dict:
    """The data run's draft vocabulary (d2t, t2d), which the drafters with one install."""
    from safetensors.torch import load_file

    path = data / "draft_vocab.safetensors"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run the data step of a recipe with "
                         "data.draft_vocab_size set, or pass another --data")
    return load_file(path)


def batch_tokens(batches: list[dict]) -> dict:
    """Real, trained and padded tokens of the timed batches (all but the first), per step."""
    timed = batches[1:] or batches  # --steps 0: the counted batch
    real = sum(int(b["attention_mask"].sum()) for b in timed)
    padded = sum(b["input_ids"].numel() for b in timed)
    trained = sum(int(b["loss_mask"].sum()) for b in timed)
    return {"real_tokens_per_step": real / len(timed), "trained_tokens_per_step":
            trained / len(timed), "padded_tokens_per_step": padded / len(timed),
            "padding_share": 1 - real / padded,
            "shapes": [list(b["input_ids"].shape) for b in batches]}


def eagle3_rows(batches: list[dict]) -> str:
    """Rows EAGLE-3's row-wise parts compute on the timed batches, as a Markdown table: packed
    (before issue 53: real tokens at step 0, positions trained at that step or later after,
    heads on trained rows), every position (the first read-free step) and gathered (heads and
    teacher on the collate's trained positions, the decoder layer on every position)."""
    import torch

    from draftsmith.models.layers import next_trained_rows, shift_left
    from draftsmith.models.ttt_rows import ttt_rows

    steps = recipe_settings("eagle3")["ttt_steps"]
    totals = [[0, 0, 0] for _ in range(3)]
    real = trained = padded = 0
    for batch in batches[1:]:
        attention_mask, loss_mask = batch["attention_mask"], batch["loss_mask"]
        b, t = attention_mask.shape
        index = torch.arange(t)[None]
        valid = [(shift_left(loss_mask, 2 + j) > 0) & (index < t - 2 - j) for j in range(steps)]
        every = b * t * steps
        m = len(next_trained_rows(loss_mask))
        counts = [(sum(int(n.sum()) for n in ttt_rows(attention_mask, valid)), every, every),
                  (sum(int(v.sum()) for v in valid),
                   sum(b * max(t - 2 - j, 0) for j in range(steps)), m * steps),
                  (int((shift_left(loss_mask, 1) > 0).sum()), b * t, m)]
        for total, count in zip(totals, counts, strict=True):
            for i, value in enumerate(count):
                total[i] += value
        real += int(attention_mask.sum())
        trained += int(loss_mask.sum())
        padded += b * t
    lines = [f"{len(batches) - 1} batches: real tokens {real:,}, trained {trained:,} of "
             f"{padded:,}", "",
             f"| EAGLE-3, {steps} TTT steps | packed | every position | gathered | gathered / "
             "packed |", "|---|---|---|---|---|"]
    for name, (packed, every, gathered) in zip(
            ("decoder layer (all steps)", "draft head (all steps)", "target head (once)"),
            totals, strict=True):
        lines.append(f"| {name} | {packed:,} | {every:,} | {gathered:,} | "
                     f"{gathered / packed:.2f} |")
    return "\n".join(lines) + "\n"


def recipe_section(kind: str, section: str) -> dict:
    """A section of the kind's smollm2-135m recipe (`drafter` without `kind`)."""
    import yaml

    found = yaml.safe_load((RECIPES / f"{KINDS[kind]}.yaml").read_text()).get(section) or {}
    return {key: value for key, value in found.items() if key != "kind"}


def recipe_settings(kind: str) -> dict:
    """The drafter section of the kind's smollm2-135m recipe, without `kind`."""
    return recipe_section(kind, "drafter")


def as_training_runs(kind: str, drafter, bf16: bool) -> None:
    """What a CPU training run of the checkout sets up around the step, where it has it: freed
    host memory kept for reuse (`4b7d507`, unless the kind's recipe sets `reuse_host_memory:
    false`) and, in bf16, the drafter's linear row counts rounded up to 64 (`1acdb26`)."""
    try:
        from draftsmith.host_memory import reuse_freed_memory
        from draftsmith.models.row_buckets import DEFAULT_MULTIPLE, bucket_rows
    except ImportError:  # a checkout before them
        return
    if recipe_section(kind, "train").get("reuse_host_memory", True):
        reuse_freed_memory()
    if bf16:
        bucket_rows(drafter, DEFAULT_MULTIPLE)


def worker(kind: str, dtype_name: str, batches_path: str) -> dict:
    """One kind at one precision in this process's `draftsmith`, on the saved batches."""
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
    saved = torch.load(batches_path, weights_only=True)
    drafter = spec.build(config, settings)
    if getattr(drafter, "reduced_vocab", False):  # the data's, as training installs it
        drafter.set_draft_vocab(saved["draft_vocab"]["d2t"], saved["draft_vocab"]["t2d"])
    drafter.init_from_target(target)
    drafter.train()
    as_training_runs(kind, drafter, bf16)
    gen = torch.Generator().manual_seed(1)
    layers = spec.aux_layers(config.num_hidden_layers, settings)

    def features(batch):
        def hidden():
            return torch.randn(*batch["input_ids"].shape, config.hidden_size,
                               generator=gen).to(feature_dtype)

        rows = {key: batch[key] for key in ("next_trained",)  # the collate's, where it counts
                if key in Features.__dataclass_fields__}
        if getattr(spec, "collate_rows", None):  # a kind's own rows, drawn where the collate does
            rows["kind_rows"] = spec.collate_rows(settings, 0, batch["input_ids"],
                                                  batch["attention_mask"], batch["loss_mask"])
        return Features(batch["input_ids"], batch["attention_mask"], batch["loss_mask"],
                        hidden(), [hidden() for _ in layers], head,
                        target_argmax=batch["target_argmax"], **rows)

    def step(features):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = spec.loss(drafter, features)
        loss.backward()
        drafter.zero_grad(set_to_none=True)

    batches = [features(b) for b in saved["batches"]]
    reads = _reads_mode()
    with reads:  # the count, and the warm-up, on the first batch
        step(batches[0])
    counted = {"host_reads": sum(reads.counts.values()), "reads_by_op": dict(reads.counts)}
    if len(batches) == 1:  # --steps 0
        return counted
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches[1:]:
        step(batch)
    timed = len(batches) - 1
    return {"seconds_per_step": (time.perf_counter() - wall) / timed,
            "cpu_seconds_per_step": (time.process_time() - cpu) / timed, **counted}


def run(checkout: Path, kind: str, dtype: str, batches_path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    script = str(Path(__file__).resolve())
    load = os.getloadavg()[0]
    out = subprocess.run([sys.executable, script, "--worker", kind, dtype, str(batches_path)],
                         env=env, capture_output=True, text=True, cwd=checkout)
    if out.returncode:
        raise SystemExit(f"{kind} {dtype} at {checkout} failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]),
            "load_average": [load, os.getloadavg()[0]]}


def table(record: dict) -> str:
    """The record's rows as a Markdown table (s/step and real tokens/s where timed, reads
    always)."""
    per_step = record["tokens"]["real_tokens_per_step"]

    def seconds(run, key):
        return f"{run[key]:.2f}" if key in run else "-"

    def rate(run):
        return f"{per_step / run['seconds_per_step']:,.0f}" if "seconds_per_step" in run else "-"

    lines = ["| kind | dtype | s/step before | after | CPU s/step before | after | real tokens/s "
             "before | after | host reads before | after |", "|---" * 10 + "|"]
    for row in record["rows"]:
        before, after = row["before"], row["after"]
        lines.append(f"| {row['kind']} | {row['dtype']} | {seconds(before, 'seconds_per_step')} | "
                     f"{seconds(after, 'seconds_per_step')} | "
                     f"{seconds(before, 'cpu_seconds_per_step')} | "
                     f"{seconds(after, 'cpu_seconds_per_step')} | {rate(before)} | "
                     f"{rate(after)} | {before['host_reads']} | {after['host_reads']} |")
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="checkout of the old code (required)")
    parser.add_argument("--after", type=Path, default=Path.cwd())
    parser.add_argument("--data", type=Path, default=Path("runs/quickstart/data"),
                        help="a data run's folder (its tokenized.jsonl)")
    parser.add_argument("--batching", choices=("tokens", "rows"), default="tokens")
    parser.add_argument("--budget", type=int, default=1536,
                        help="padded tokens per batch (tokens; the quickstart's 4 x 384)")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per batch (rows)")
    parser.add_argument("--max-length", type=int, default=384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4,
                        help="timed batches per measurement; 0 counts the reads only (no lock "
                        "needed: nothing is timed)")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS))
    parser.add_argument("--dtypes", nargs="*", default=["fp32", "bf16"])
    parser.add_argument("--out", type=Path, help="the JSON written (required)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--table", type=Path, help="print a written JSON's Markdown table")
    parser.add_argument("--rows", action="store_true",
                        help="print the rows EAGLE-3's packed and every-position steps compute "
                        "on the timed batches")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())), end="")
        return
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    batches = plan_batches(args, args.steps + 1)
    if args.rows:
        print(eagle3_rows(batches), end="")
        return
    if args.before is None or args.out is None:
        raise SystemExit("--before and --out are required")
    import torch

    from draftsmith.target.precision import describe_hardware, hardware_record

    batches_path = args.out.resolve().with_suffix(".batches.pt")
    torch.save({"batches": batches, "draft_vocab": draft_vocab(args.data)}, batches_path)
    commits = {name: subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip()
               for name, path in (("before", args.before), ("after", args.after))}
    record = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "data": str(args.data), "batching": args.batching, "budget": args.budget,
              "batch_size": args.batch_size, "max_length": args.max_length,
              "tokens": batch_tokens(batches), "target_shape": SHAPE,
              "settings": {kind: recipe_settings(kind) for kind in args.kinds},
              "steps": args.steps, "commits": commits,
              "hardware": describe_hardware(hardware_record("cpu")), "rows": []}
    arms = [("before", args.before.resolve()), ("after", args.after.resolve())]
    for dtype in args.dtypes:
        for i, kind in enumerate(args.kinds):  # A/B, then B/A: drift falls on both arms
            order = arms if i % 2 == 0 else arms[::-1]
            done = {name: run(path, kind, dtype, batches_path) for name, path in order}
            record["rows"].append({"kind": kind, "dtype": dtype, **done})
            args.out.write_text(json.dumps(record, indent=2) + "\n")  # each row as it lands
            print(kind, dtype, f"{done['before'].get('cpu_seconds_per_step')} -> "
                  f"{done['after'].get('cpu_seconds_per_step')} CPU s/step, reads "
                  f"{done['before']['host_reads']} -> {done['after']['host_reads']}", flush=True)
    batches_path.unlink()


if __name__ == "__main__":
    main()
