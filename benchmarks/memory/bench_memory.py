"""Memory of EAGLE-3 training on this machine, before and after bounded-memory training (issue 29):
peak RSS of offline training from a ~100K- and a ~1M-token cache, and peak memory and time of
one EAGLE-3 step (forward + backward) at 384 and 2048 tokens, for the code at a "before" commit
and at this tree, alternated run by run in fresh processes.

    python benchmarks/memory/bench_memory.py --cache runs/bench29/bf16/cache \\
        --vocab runs/bench29/bf16/draft_vocab.safetensors --parts step   # -> --out FILE.json

The 100K cache is a real one (SmolLM2-135M-Instruct on ShareGPT first exchanges, `draftsmith data
run`); the ~1M cache is made from it by listing its shards 10 times (hard links: the real format
and shapes, the same bytes repeated). The step uses SmolLM2-135M's shapes (its config) with random
hidden states and a random head of the target's size: memory and time depend on shapes only.
Each measurement runs in its own process (`--worker`) with PYTHONPATH set to the tree measured;
its peak is sampled from /proc/self/statm every 2 ms (step) or read from ru_maxrss (training).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file: benchmarks/memory/)
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


class PeakSampler:
    """Highest RSS seen while the block runs (a thread polling /proc every 2 ms)."""

    def __enter__(self):
        self.peak, self.running = rss_bytes(), True
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while self.running:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, rss_bytes())


def worker_step(args) -> dict:
    """One EAGLE-3 training step at `args.tokens` tokens (batch 1), SmolLM2-135M shapes, bf16
    autocast as `mixed_precision: auto` picks on this CPU: peak RSS above the baseline and time."""
    import torch
    from transformers import AutoConfig

    from draftsmith.draft_vocab.file import load_draft_vocab
    from draftsmith.models.eagle3 import Eagle3Config
    from draftsmith.models.features import cached_features
    from draftsmith.registry import get_spec

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.target_config)
    spec = get_spec("eagle3")
    drafter = spec.build(config, Eagle3Config(draft_vocab_size=8192, ttt_steps=args.ttt_steps))
    vocab = load_draft_vocab(args.vocab)
    drafter.set_draft_vocab(vocab.d2t, vocab.t2d)
    if args.checkpointing:
        from draftsmith.models.layers import set_gradient_checkpointing

        set_gradient_checkpointing(drafter, True)
    layers = config.num_hidden_layers
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False).to(torch.bfloat16)
    head.requires_grad_(False)
    aux = spec.aux_layers(layers, drafter.config)
    t = args.tokens
    batch = {"input_ids": torch.randint(0, config.vocab_size, (1, t)),
             "attention_mask": torch.ones(1, t, dtype=torch.long),
             "loss_mask": torch.ones(1, t, dtype=torch.long)}
    batch["loss_mask"][:, : t // 8] = 0  # a prompt
    for i in sorted({*(a + 1 for a in aux), layers}):
        batch[f"hidden_states.{i}"] = torch.randn(1, t, config.hidden_size, dtype=torch.bfloat16)
    with torch.no_grad():
        batch["target_argmax"] = head(batch[f"hidden_states.{layers}"]).argmax(-1)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = spec.loss(drafter, cached_features(batch, head, aux, layers))
        loss.backward()
        drafter.zero_grad(set_to_none=True)

    baseline = rss_bytes()
    with PeakSampler() as sampler:
        step()
    peak = sampler.peak - baseline
    times = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    return {"peak_step_mib": round(peak / 2 ** 20, 1), "baseline_mib": round(baseline / 2 ** 20, 1),
            "seconds": [round(x, 3) for x in times], "median_seconds": round(
                statistics.median(times), 3)}


def worker_train(args) -> dict:
    """Offline EAGLE-3 training for a few steps from a cache folder with the tree's own reader
    (this tree: the per-rank stream; before: the whole cache read into a list): peak RSS."""
    import torch

    from draftsmith.draft_vocab.file import read_draft_vocab
    from draftsmith.target.load import load_target
    from draftsmith.train.loop import run_training
    from draftsmith.train.recipe import build_recipe

    torch.manual_seed(0)
    target = load_target("smollm2-135m-instruct")
    after_load = rss_bytes()
    recipe = build_recipe({
        "target": {"name": "smollm2-135m-instruct"},
        "drafter": {"kind": "eagle3", "draft_vocab_size": 8192, "ttt_steps": 3},
        "data": {"cache": {"kinds": ["eagle3"]}},
        "train": {"features": "offline", "batch_size": 4, "max_length": 256,
                  "max_steps": args.steps, "warmup_steps": 1, "eval_fraction": 0.01,
                  "output_dir": args.output_dir}})
    began = time.perf_counter()
    try:
        from draftsmith.train.run import stream_cache

        examples = stream_cache(recipe, Path(args.cache), target)
    except ImportError:  # before: the whole cache as a list
        from draftsmith.train.run import read_cache

        examples = read_cache(recipe, Path(args.cache), target)
    vocab = read_draft_vocab(Path(args.vocab), int(target.model.config.vocab_size))
    run_training(recipe, examples, target=target.model, draft_vocab=vocab)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_rss_mib": round(peak / 2 ** 20, 1),
            "rss_after_target_load_mib": round(after_load / 2 ** 20, 1),
            "seconds": round(time.perf_counter() - began, 1)}


def worker_attention(args) -> dict:
    """The attention of TTT step j = ttt_steps - 1 alone, forward + backward, bf16, SmolLM2-135M's
    heads (9 query, 3 KV, head dim 64), batch 1: `dense` = SDPA with the `ttt_masks` bool mask and
    enable_gqa (the code before), `ttt` = `ttt_attention`. Peak RSS above the inputs, and time."""
    import torch
    import torch.nn.functional as F

    from draftsmith.models.ttt_attention import ttt_attention
    from draftsmith.models.ttt_rows import ttt_masks

    torch.manual_seed(0)
    j, t = args.ttt_steps - 1, args.tokens
    q = torch.randn(1, 9, t, 64, dtype=torch.bfloat16, requires_grad=True)
    blocks = [tuple(torch.randn(1, 3, t, 64, dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(2)) for _ in range(j + 1)]
    baseline = rss_bytes()
    with PeakSampler() as sampler:
        began = time.perf_counter()
        if args.which == "dense":
            mask = ttt_masks(torch.ones(1, t, dtype=torch.long), j + 1)[-1]
            out = F.scaled_dot_product_attention(
                q, torch.cat([k for k, _ in blocks], 2), torch.cat([v for _, v in blocks], 2),
                attn_mask=mask, enable_gqa=True)
        else:
            out = ttt_attention(q, blocks[0], blocks[1:])
        out.float().square().sum().backward()
        seconds = time.perf_counter() - began
    return {"peak_mib": round((sampler.peak - baseline) / 2 ** 20, 1),
            "seconds": round(seconds, 3)}


def worker_epoch(args) -> dict:
    """One epoch of offline training batches (batch 4, 256 tokens, shuffled) read with the tree's
    own reader and no model: before, the cache's samples as a list (memory-mapped views, in a
    shuffled order); this tree, the per-rank stream. Peak RSS, and the anonymous and file-backed
    (mapped cache pages) parts at the end."""
    import random

    from draftsmith.data.cache_reader import FeatureCache
    from draftsmith.train.batching import collate

    cache = FeatureCache.open(args.cache)
    keys = [f"hidden_states.{i}" for i in cache.layers]
    began, batches = time.perf_counter(), 0
    try:
        from draftsmith.train.cache_stream import CacheStream
    except ImportError:  # before
        samples = list(cache.iter_samples(keys=keys, extras=("target_argmax",)))
        order = list(range(len(samples)))
        random.Random(0).shuffle(order)
        for start in range(0, len(order) - 3, 4):
            collate([samples[i] for i in order[start:start + 4]], 256)
            batches += 1
    else:
        stream = CacheStream(cache, keys, ("target_argmax",), batch_size=4, max_length=256,
                             seed=0, eval_fraction=0.01, rank=0, world_size=1, window=4)
        for _ in stream.train_batches(0):
            batches += 1
    status = {line.split(":")[0]: int(line.split()[1])
              for line in Path("/proc/self/status").read_text().splitlines()
              if line.startswith(("RssAnon", "RssFile"))}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_rss_mib": round(peak / 2 ** 20, 1), "batches": batches,
            "rss_anon_end_mib": round(status["RssAnon"] / 1024, 1),
            "rss_file_end_mib": round(status["RssFile"] / 1024, 1),
            "seconds": round(time.perf_counter() - began, 1)}


def run_worker(tree: Path, mode: str, extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, __file__, "--worker", mode, *extra], env=env,
                         capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"worker {mode} in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def million_token_cache(cache: Path, folder: Path, copies: int) -> Path:
    """The cache's shards listed `copies` times (hard links) under one manifest."""
    manifest = json.loads((cache / "manifest.json").read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shards = []
    for copy in range(copies):
        for shard in manifest["shards"]:
            index = copy * len(manifest["shards"]) + shard["index"]
            name = f"shard-{index:05d}.safetensors"
            os.link(cache / shard["file"], folder / name)
            shards.append({**shard, "index": index, "file": name})
    manifest["shards"] = shards
    manifest["settings"]["samples"] *= copies
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def compact_cache_record(runs: list[Path]) -> dict:
    """Bytes per token and held-out accuracy of training runs that differ in the cache dtype
    (their data folders' summary.json, their final evaluation in metrics.jsonl)."""
    record = {}
    for run in runs:
        settings = json.loads((run / "drafter" / "draftsmith_drafter.json").read_text())["recipe"]
        summary = json.loads((Path(settings["data"]["out_dir"]) / "summary.json").read_text())
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        final = [r for r in rows if "eval/acc_0" in r][-1]
        record[settings["data"]["cache"]["dtype"]] = {
            "run": str(run), "bytes_per_token": summary["cache"]["bytes_per_token"],
            "cache_tokens": summary["cache"]["extraction"]["tokens"], "steps": final["step"],
            **{k: round(v, 4) for k, v in final.items() if k.startswith("eval/")}}
    return record


def tree_at(commit: str) -> Path:
    """The package as of `commit`, unpacked into a temporary folder (the worktree is untouched)."""
    folder = Path(tempfile.mkdtemp(prefix=f"draftsmith-{commit[:7]}-"))
    archive = subprocess.run(["git", "archive", commit, "draftsmith"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", choices=["step", "train", "epoch", "attention"])
    parser.add_argument("--which", choices=["dense", "ttt"], default="ttt")
    parser.add_argument("--cache", default="runs/bench29/bf16/cache")
    parser.add_argument("--vocab", default="runs/bench29/bf16/draft_vocab.safetensors")
    parser.add_argument("--target-config",
                        default=str(Path.home() / ".cache/draftsmith/models/smollm2-135m-instruct"))
    parser.add_argument("--before", default="fad8714", help="commit measured as 'before'")
    parser.add_argument("--tokens", type=int, default=384)
    parser.add_argument("--ttt-steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps after the first")
    parser.add_argument("--rounds", type=int, default=2, help="before/after alternations")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--steps", type=int, default=10, help="training steps per RSS run")
    parser.add_argument("--train-rounds", type=int, default=1, help="RSS runs of each kind")
    parser.add_argument("--output-dir", default="")
    parser.add_argument("--parts", default="step,train,epoch",
                        help="step, train, epoch, attention and/or compact")
    parser.add_argument("--compact-runs", default="runs/bench29/train-bf16,runs/bench29/train-f8",
                        help="compact: training output folders to compare")
    parser.add_argument("--out", default="benchmarks/memory/step.json")
    args = parser.parse_args()
    if args.worker:
        result = {"step": worker_step, "train": worker_train, "epoch": worker_epoch,
                  "attention": worker_attention}[
            args.worker](args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    if "compact" in args.parts:
        result["compact_cache"] = compact_cache_record(
            [Path(p) for p in args.compact_runs.split(",")])
    before = tree_at(args.before) if {"step", "train", "epoch"} & set(args.parts.split(",")) \
        else None
    trees = {"before": before, "after": ROOT}
    common = ["--vocab", args.vocab, "--target-config", args.target_config]
    if "step" in args.parts:
        steps = {}
        for rnd in range(args.rounds):
            for tokens in (384, 2048):
                for name, ckpt in (("before", False), ("after", False), ("after_checkpointing",
                                                                        True)):
                    tree = trees[name.split("_")[0]]
                    extra = [*common, "--tokens", str(tokens), "--ttt-steps", str(args.ttt_steps),
                             "--repeats", str(args.repeats), *(["--checkpointing"] if ckpt else [])]
                    measured = run_worker(tree, "step", extra)
                    steps.setdefault(f"{tokens}", {}).setdefault(name, []).append(measured)
                    print(f"round {rnd} T={tokens} {name}: {measured}", flush=True)
        result["step"] = {"batch": 1, "ttt_steps": args.ttt_steps, "runs": steps}
    if "train" in args.parts:
        cache = Path(args.cache)
        big = million_token_cache(cache, cache.parent / "cache-1m", 10)
        train = {}
        for rnd in range(args.train_rounds):
            for label, folder in (("100k", cache), ("1m", big)):
                for name in ("before", "after"):
                    with tempfile.TemporaryDirectory() as tmp:
                        extra = [*common, "--cache", str(folder), "--steps", str(args.steps),
                                 "--output-dir", tmp]
                        measured = run_worker(trees[name], "train", extra)
                    train.setdefault(label, {}).setdefault(name, []).append(measured)
                    print(f"round {rnd} cache {label} {name}: {measured}", flush=True)
        tokens = {label: sum(s["tokens"] for s in json.loads(
            (folder / "manifest.json").read_text())["shards"]) for label, folder in
            (("100k", cache), ("1m", big))}
        result["train"] = {"tokens": tokens, "steps": args.steps, "runs": train}
    if "attention" in args.parts:
        attention = {}
        for rnd in range(args.rounds):
            for tokens in (384, 2048):
                for which in ("dense", "ttt"):
                    measured = run_worker(ROOT, "attention", [
                        "--which", which, "--tokens", str(tokens), "--ttt-steps",
                        str(args.ttt_steps)])
                    attention.setdefault(f"{tokens}", {}).setdefault(which, []).append(measured)
                    print(f"round {rnd} attention T={tokens} {which}: {measured}", flush=True)
        result["attention"] = {"ttt_step": args.ttt_steps - 1, "runs": attention}
    if "epoch" in args.parts:
        cache = Path(args.cache)
        big = million_token_cache(cache, cache.parent / "cache-1m", 10)
        epoch = {}
        for label, folder in (("100k", cache), ("1m", big)):
            for name in ("before", "after"):
                measured = run_worker(trees[name], "epoch", ["--cache", str(folder)])
                epoch.setdefault(label, {})[name] = measured
                print(f"epoch cache {label} {name}: {measured}", flush=True)
        result["epoch"] = epoch
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if before is not None:
        shutil.rmtree(before, ignore_errors=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
