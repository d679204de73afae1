"""Decoding-loop overhead benchmark: drafters that are always right (the target drafting for itself,
as a chain and as an EAGLE-2 dynamic tree) against the bound tau * T(1-token step) / (T(verify) +
T(draft)); the rest of a step is the loop's own bookkeeping.

Writes benchmarks/overhead.json and prints one line per method. Usage:
    .venv/bin/python benchmarks/overhead/bench_overhead.py [--target smollm2-135m-instruct] \
        [--dtype auto]
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import NoDraftProposer
from draftsmith.decoding.proposers.draft_model import DraftModelProposer, DraftModelTreeProposer
from draftsmith.decoding.proposers.tree_expansion import DynamicTreeConfig
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.eval.prompts.sets import load_prompts
from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.target.chat import render_chat
from draftsmith.target.load import load_target
from draftsmith.target.precision import describe_hardware, hardware_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--tree", default="4,6,16", help="dynamic tree: topk,depth,total_tokens")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/overhead.json")
    args = parser.parse_args()

    target = load_target(args.target, dtype=args.dtype)
    runner = CausalLMRunner(target.model)
    tree = DynamicTreeConfig(*(int(v) for v in args.tree.split(",")))
    methods = {
        "chain": lambda: DraftModelProposer(target.model, args.num_draft_tokens),
        "dynamic_tree": lambda: DraftModelTreeProposer(target.model, dynamic=tree),
    }
    prompts = [p for s in ("mt_bench", "humaneval", "gsm8k") for p in load_prompts(s, args.limit)]
    warm = render_chat(target.tokenizer, [{"role": "user", "content": "Hi"}])
    generate(runner, NoDraftProposer(), warm, 8)
    for make in methods.values():
        generate(runner, make(), warm, 8)

    plain = {"steps": 0, "seconds": 0.0, "tokens": 0}
    totals = {name: {"steps": 0, "tokens": 0, "seconds": 0.0, "verify": 0.0, "draft": 0.0}
              for name in methods}
    for item in prompts:
        ids = render_chat(target.tokenizer, [{"role": "user", "content": item.turns[0]}])
        reference = generate(runner, NoDraftProposer(), ids, args.max_new_tokens)
        plain["steps"] += reference.steps
        plain["seconds"] += sum(reference.step_seconds)
        plain["tokens"] += len(reference.tokens)
        for name, make in methods.items():
            spec = generate(runner, make(), ids, args.max_new_tokens)
            assert spec.tokens == reference.tokens or target.dtype_choice.dtype != "float32"
            t = totals[name]
            t["steps"] += spec.steps
            t["tokens"] += len(spec.tokens)
            t["seconds"] += sum(spec.step_seconds)
            t["verify"] += spec.verify_seconds
            t["draft"] += spec.draft_seconds

    t_step = plain["seconds"] / plain["steps"]
    plain_rate = plain["tokens"] / plain["seconds"]
    result = {
        "target": args.target, "dtype": target.dtype_choice.dtype,
        "num_draft_tokens": args.num_draft_tokens, "tree": args.tree, "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens, "t_step_ms": t_step * 1e3, "methods": {},
        "hardware": describe_hardware(hardware_record("cpu", target.dtype_choice)),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    for name, t in totals.items():
        tau = t["tokens"] / t["steps"]
        t_verify, t_draft = t["verify"] / t["steps"], t["draft"] / t["steps"]
        bookkeeping = t["seconds"] / t["steps"] - t_verify - t_draft
        measured = (t["tokens"] / t["seconds"]) / plain_rate
        bound = tau * t_step / (t_verify + t_draft)
        result["methods"][name] = {
            "tau": tau, "t_verify_ms": t_verify * 1e3, "t_draft_ms": t_draft * 1e3,
            "t_bookkeeping_ms": bookkeeping * 1e3, "measured_speedup": measured,
            "bound_speedup": bound, "overhead_ratio": measured / bound}
        print(f"{name}: tau {tau:.2f}  T(step) {t_step * 1e3:.1f} ms  T(verify) "
              f"{t_verify * 1e3:.1f} ms  T(draft) {t_draft * 1e3:.1f} ms  bookkeeping "
              f"{bookkeeping * 1e3:.2f} ms/step  measured {measured:.2f}x  bound {bound:.2f}x  "
              f"ratio {measured / bound:.3f}")
    write_json(Path(args.out), result)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
