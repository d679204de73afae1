"""Regeneration throughput, like for like (issue #12's bars): on the same ShareGPT first turns, one
after the other in one process, greedy, the same answer cap,

  * a plain left-padded batched `generate` (the reference),
  * draftsmith's in-process path (`data.regenerate.backend: transformers`),
  * draftsmith's server path (`backend: openai`, `base_url: local`: llama.cpp's server on the
    target's GGUF), once per `--concurrency` value,

new tokens per second of each, their ratios, and how closely the server's greedy answers follow
the in-process target's (its kernels and weights format differ: llama.cpp runs the Q4_1 GGUF
natively, transformers its float32 dequantization): identical answers and the mean matching
prefix, written to a JSON file (a benchmark, not a test).

    .venv/bin/python benchmarks/regenerate/bench_regenerate.py --conversations 64 \
        --max-new-tokens 128 --batch-size 16 --concurrency 8,16 \
        --out benchmarks/regenerate/smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from draftsmith.data.config import RegenerateConfig
from draftsmith.data.regenerate import generate_batch, regenerate
from draftsmith.data.regeneration_server import open_regeneration_server
from draftsmith.data.render import prompt_ids, resolve_chat_template
from draftsmith.data.sources import load_conversations
from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.target.load import load_target
from draftsmith.target.precision import describe_hardware, hardware_record

MAX_LENGTH = 384


def answers(folder: Path) -> dict[int, str]:
    return {r["index"]: r["messages"][-1]["content"] for p in sorted(folder.glob("shard-*.jsonl"))
            for r in map(json.loads, p.read_text().splitlines())}


def agreement(tokenizer, reference: dict[int, str], other: dict[int, str]) -> dict:
    """Identical answers and the mean length of the common token prefix."""
    same = prefix = total = 0
    for index, text in reference.items():
        a = tokenizer(text, add_special_tokens=False).input_ids
        b = tokenizer(other.get(index, ""), add_special_tokens=False).input_ids
        common = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                      min(len(a), len(b)))
        same += a == b
        prefix += common
        total += len(a)
    return {"answers": len(reference), "identical": same,
            "mean_common_prefix_tokens": round(prefix / max(len(reference), 1), 1),
            "mean_reference_tokens": round(total / max(len(reference), 1), 1)}


def rate(tokens: int, seconds: float) -> dict:
    return {"new_tokens": tokens, "seconds": round(seconds, 2),
            "tokens_per_second": round(tokens / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--concurrency", default="8,16", help="server requests in flight, a list")
    parser.add_argument("--out", default="benchmarks/regenerate/smollm2-135m.json")
    args = parser.parse_args()
    target = load_target(args.target)
    model, tokenizer = target.model, target.tokenizer
    template = resolve_chat_template(tokenizer)
    conversations, _ = load_conversations("sharegpt", limit=args.conversations, max_pairs=1)
    settings = RegenerateConfig(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                shard_size=args.conversations)
    eos = target.eos_token_ids
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    prompts = [prompt_ids(tokenizer, [{"role": "user", "content": c.user_turns[0]}], template)
               for c in conversations]
    prompts = [p for p in prompts if len(p) < MAX_LENGTH]
    generate_batch(model, prompts[:2], RegenerateConfig(max_new_tokens=4), eos, pad)  # warm-up

    start = time.perf_counter()
    plain_tokens = 0
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # like plan_batches
    for first in range(0, len(order), args.batch_size):
        batch = [prompts[i] for i in order[first:first + args.batch_size]]
        plain_tokens += sum(len(tokens) + int(hit_eos)
                            for tokens, hit_eos in generate_batch(model, batch, settings, eos, pad))
    plain = rate(plain_tokens, time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        start = time.perf_counter()
        report = regenerate(model, tokenizer, conversations, scratch / "in-process",
                            template=template, settings=settings, max_length=MAX_LENGTH,
                            eos_ids=eos, progress=False)
        in_process = rate(report.new_tokens, time.perf_counter() - start)
        reference = answers(scratch / "in-process")
        servers = []
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            served = RegenerateConfig(backend="openai", base_url="local", concurrency=concurrency,
                                      max_new_tokens=args.max_new_tokens,
                                      shard_size=args.conversations)
            folder = scratch / f"server-{concurrency}"
            with open_regeneration_server(served, args.target, model, tokenizer, template,
                                          MAX_LENGTH) as (server, check):
                start = time.perf_counter()
                report = regenerate(model, tokenizer, conversations, folder, template=template,
                                    settings=served, max_length=MAX_LENGTH, eos_ids=eos,
                                    progress=False, server=server)
                seconds = time.perf_counter() - start
            servers.append({"concurrency": concurrency, **rate(report.new_tokens, seconds),
                            "failed": len(report.failed), "check": check,
                            "vs_in_process": round(report.new_tokens / seconds
                                                   / in_process["tokens_per_second"], 3),
                            "greedy_agreement_with_in_process":
                                agreement(tokenizer, reference, answers(folder))})
    best = max(servers, key=lambda s: s["tokens_per_second"])
    payload = {
        "target": args.target, "conversations": len(conversations),
        "prompts_under_max_length": len(prompts), "max_length": MAX_LENGTH,
        "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "plain_generate": plain, "draftsmith_in_process": in_process,
        "in_process_vs_plain": round(in_process["tokens_per_second"]
                                     / plain["tokens_per_second"], 3),
        "draftsmith_server": servers,
        "best_server_vs_in_process": best["vs_in_process"],
        "commit": git_commit(),
        "hardware": describe_hardware(hardware_record("cpu", target.dtype_choice)),
        "torch_threads": torch.get_num_threads(),
    }
    write_json(args.out, payload)
    print(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
