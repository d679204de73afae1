"""Decoding-loop overhead benchmark: a drafter that is always right (the target drafting for itself)
against the bound tau * T(1-token step) / (T(verify) + T(draft)).

Writes benchmarks/overhead.json and prints one line per prompt set. Usage:
    .venv/bin/python scripts/bench_overhead.py [--target smollm2-135m-instruct] [--dtype auto]
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from draftsmith.chat import render_chat
from draftsmith.data.prompts import load_prompts
from draftsmith.eval.decode import generate
from draftsmith.eval.evaluate import git_commit
from draftsmith.eval.proposers.base import NoDraftProposer
from draftsmith.eval.proposers.draft_model import DraftModelProposer
from draftsmith.eval.report import write_json
from draftsmith.eval.runner import CausalLMRunner
from draftsmith.precision import describe_hardware, hardware_record
from draftsmith.target import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/overhead.json")
    args = parser.parse_args()

    target = load_target(args.target, dtype=args.dtype)
    runner = CausalLMRunner(target.model)
    prompts = [p for s in ("mt_bench", "humaneval", "gsm8k") for p in load_prompts(s, args.limit)]
    warm = render_chat(target.tokenizer, [{"role": "user", "content": "Hi"}])
    generate(runner, NoDraftProposer(), warm, 8)
    generate(runner, DraftModelProposer(target.model, args.num_draft_tokens), warm, 8)

    totals = {"plain_steps": 0, "plain_seconds": 0.0, "plain_tokens": 0, "spec_steps": 0,
              "spec_tokens": 0, "spec_seconds": 0.0, "verify": 0.0, "draft": 0.0}
    for item in prompts:
        ids = render_chat(target.tokenizer, [{"role": "user", "content": item.turns[0]}])
        plain = generate(runner, NoDraftProposer(), ids, args.max_new_tokens)
        spec = generate(runner, DraftModelProposer(target.model, args.num_draft_tokens), ids,
                        args.max_new_tokens)
        assert spec.tokens == plain.tokens or args.dtype != "float32"
        totals["plain_steps"] += plain.steps
        totals["plain_seconds"] += sum(plain.step_seconds)
        totals["plain_tokens"] += len(plain.tokens)
        totals["spec_steps"] += spec.steps
        totals["spec_tokens"] += len(spec.tokens)
        totals["spec_seconds"] += sum(spec.step_seconds)
        totals["verify"] += spec.verify_seconds
        totals["draft"] += spec.draft_seconds

    t_step = totals["plain_seconds"] / totals["plain_steps"]
    tau = totals["spec_tokens"] / totals["spec_steps"]
    t_verify = totals["verify"] / totals["spec_steps"]
    t_draft = totals["draft"] / totals["spec_steps"]
    measured = (totals["spec_tokens"] / totals["spec_seconds"]) / (
        totals["plain_tokens"] / totals["plain_seconds"])
    bound = tau * t_step / (t_verify + t_draft)
    result = {
        "target": args.target, "dtype": args.dtype, "num_draft_tokens": args.num_draft_tokens,
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "tau": tau, "t_step_ms": t_step * 1e3, "t_verify_ms": t_verify * 1e3,
        "t_draft_ms": t_draft * 1e3, "measured_speedup": measured, "bound_speedup": bound,
        "overhead_ratio": measured / bound,
        "hardware": describe_hardware(hardware_record("cpu", target.dtype_choice)),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write_json(Path(args.out), result)
    print(f"tau {tau:.2f}  T(step) {t_step * 1e3:.1f} ms  T(verify) {t_verify * 1e3:.1f} ms  "
          f"T(draft) {t_draft * 1e3:.1f} ms  measured {measured:.2f}x  bound {bound:.2f}x  "
          f"ratio {measured / bound:.3f}  -> {args.out}")


if __name__ == "__main__":
    main()
