"""Regeneration throughput, like for like: draftsmith's in-process path (`data.regenerate`, the
transformers backend) against a plain left-padded batched `generate` on the same ShareGPT first
turns, same batch size and budget, greedy, one after the other in one process; new tokens per
second of each written to a JSON file (a benchmark, not a test; issue #12's first bar).

    .venv/bin/python scripts/bench_regenerate.py --conversations 32 --max-new-tokens 128 \
        --batch-size 16 --out benchmarks/regenerate/smollm2-135m.json
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from draftsmith.data.config import RegenerateConfig
from draftsmith.data.regenerate import generate_batch, regenerate
from draftsmith.data.render import prompt_ids, resolve_chat_template
from draftsmith.data.sources import load_conversations
from draftsmith.eval.evaluate import git_commit
from draftsmith.files import write_json
from draftsmith.precision import describe_hardware, hardware_record
from draftsmith.target import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
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
    prompts = [p for p in prompts if len(p) < 384]
    generate_batch(model, prompts[:2], RegenerateConfig(max_new_tokens=4), eos, pad)  # warm-up

    start = time.perf_counter()
    plain_tokens = 0
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # like plan_batches
    for first in range(0, len(order), args.batch_size):
        batch = [prompts[i] for i in order[first:first + args.batch_size]]
        answers = generate_batch(model, batch, settings, eos, pad)
        plain_tokens += sum(len(tokens) + int(hit_eos) for tokens, hit_eos in answers)
    plain_seconds = time.perf_counter() - start

    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        report = regenerate(model, tokenizer, conversations, folder, template=template,
                            settings=settings, max_length=384, eos_ids=eos, progress=False)
        ours_seconds = time.perf_counter() - start
    payload = {
        "target": args.target, "conversations": len(conversations), "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "plain_generate": {"new_tokens": plain_tokens, "seconds": round(plain_seconds, 2),
                           "tokens_per_second": round(plain_tokens / plain_seconds, 1)},
        "draftsmith_regenerate": {"new_tokens": report.new_tokens,
                                  "seconds": round(ours_seconds, 2),
                                  "tokens_per_second": round(report.new_tokens / ours_seconds, 1)},
        "ratio": round((report.new_tokens / ours_seconds) / (plain_tokens / plain_seconds), 3),
        "commit": git_commit(),
        "hardware": describe_hardware(hardware_record("cpu", target.dtype_choice)),
        "torch_threads": torch.get_num_threads(),
    }
    write_json(args.out, payload)
    print(payload)


if __name__ == "__main__":
    main()
