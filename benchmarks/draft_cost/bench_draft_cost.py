"""What one round of drafting costs in the decoding loop, per method and tree, on this machine: a
benchmark (not a test) written to a JSON file.

    .venv/bin/python benchmarks/draft_cost/bench_draft_cost.py --out benchmarks/draft_cost/NAME.json

Every case decodes the same prompts (first turns of MT-bench, HumanEval and GSM8K) through
`draftsmith.decoding.generate`, the loop the evaluation times, with a drafter of the benchmark's
shapes (EAGLE-3 with an 8K draft vocabulary; DFlash with block 8 and 2 layers, over the 8K
vocabulary and over the whole one) built from its recipe settings with the target's frozen
embedding and head and untrained weights elsewhere: a forward costs the same trained or not, so
the draft time of a round is measured without a trained drafter. (Untrained drafts are rejected,
so every round feeds one verified token back; a trained drafter's accepted tokens add a few rows
to the next round's feature update.) The cases alternate, `--repeats` times, and the median
round of each is reported with the verify forward's, so the draft share of a round is the
loop's own.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

from draftsmith.decoding.decode import generate
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.eval.methods import make_drafter_proposer
from draftsmith.eval.prompts.files import gather_prompts
from draftsmith.eval.settings import DecodeSettings
from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.registry import get_spec
from draftsmith.target.chat import render_chat
from draftsmith.target.load import load_target
from draftsmith.target.precision import describe_hardware, hardware_record

DRAFTERS = {  # label -> (kind, settings): the SmolLM2 benchmark's entries
    "eagle3": ("eagle3", {"draft_vocab_size": 8192, "ttt_steps": 3}),
    "dflash8k": ("dflash", {"block_size": 8, "num_layers": 2, "mask_token_id": 16,
                            "draft_vocab_size": 8192}),
    "dflash": ("dflash", {"block_size": 8, "num_layers": 2, "mask_token_id": 16}),
}
# label -> (drafter, method, tree (topk, depth, total_tokens) or None, block length or None)
CASES = {
    "EAGLE-3 tree depth 1 x 3": ("eagle3", "drafter_dynamic", (3, 1, 3), None),
    "EAGLE-3 tree depth 2 x 5": ("eagle3", "drafter_dynamic", (3, 2, 5), None),
    "EAGLE-3 tree depth 3 x 6": ("eagle3", "drafter_dynamic", (3, 3, 6), None),
    "EAGLE-3 tree depth 4 x 8": ("eagle3", "drafter_dynamic", (3, 4, 8), None),
    "DFlash 8K chain of 3": ("dflash8k", "drafter_chain", None, 3),
    "DFlash 8K chain of 7": ("dflash8k", "drafter_chain", None, 7),
    "DFlash 8K DDTree depth 3 x 5": ("dflash8k", "drafter_dynamic", (3, 3, 5), 3),
    "DFlash 8K DDTree depth 7 x 16": ("dflash8k", "drafter_dynamic", (3, 7, 16), 7),
    "DFlash chain of 7 (whole vocabulary)": ("dflash", "drafter_chain", None, 7),
}


def build_drafter(target, kind: str, settings: dict):
    """An untrained drafter of `kind` with the target's frozen embedding and head, in its dtype."""
    spec = get_spec(kind)
    module = spec.build(target.model.config, spec.make_config(settings))
    module.init_from_target(target.model)
    return module.to(target.model.dtype).eval().requires_grad_(False)


def decode_case(runner, proposer, prompts: list[list[int]], new_tokens: int) -> dict:
    """Rounds, draft and verify seconds of one pass over the prompts."""
    rounds = draft = verify = total = 0.0
    for ids in prompts:
        result = generate(runner, proposer, ids, new_tokens)
        rounds += len(result.step_seconds)
        draft += result.draft_seconds
        verify += result.verify_seconds
        total += sum(result.step_seconds)
    return {"rounds": rounds, "draft_ms": 1e3 * draft / rounds, "verify_ms": 1e3 * verify / rounds,
            "round_ms": 1e3 * total / rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--limit", type=int, default=2, help="prompts per set")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3, help="alternating passes per case")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    target = load_target(args.target, dtype=args.dtype)
    runner = CausalLMRunner(target.model, output_hidden_states=True)
    prompts = [render_chat(target.tokenizer, [{"role": "user", "content": p.turns[0]}])
               for p in gather_prompts(["mt_bench", "humaneval", "gsm8k"], (), args.limit)]
    drafters = {label: types.SimpleNamespace(kind=kind, module=build_drafter(target, kind, s))
                for label, (kind, s) in DRAFTERS.items()}
    proposers = {}
    for name, (label, method, tree, block_length) in CASES.items():
        topk, depth, total = tree or (3, 4, 8)
        settings = DecodeSettings(tree_topk=topk, tree_depth=depth, tree_total_tokens=total,
                                  block_length=block_length,
                                  num_draft_tokens=block_length or 4)
        proposers[name] = make_drafter_proposer(method, drafters[label], settings)
    generate(runner, next(iter(proposers.values())), prompts[0], 8)  # warm-up
    passes = {name: [] for name in CASES}
    started = time.time()
    for _ in range(args.repeats):
        for name, proposer in proposers.items():
            passes[name].append(decode_case(runner, proposer, prompts, args.new_tokens))
            print(name, passes[name][-1], flush=True)
    rows = []
    for name, runs in passes.items():
        label, method, tree, block_length = CASES[name]
        draft = statistics.median(r["draft_ms"] for r in runs)
        round_ms = statistics.median(r["round_ms"] for r in runs)
        rows.append({"case": name, "drafter": label, "kind": DRAFTERS[label][0],
                     "settings": DRAFTERS[label][1], "method": method,
                     "tree": dict(zip(("topk", "depth", "total_tokens"), tree, strict=True))
                     if tree else None, "block_length": block_length,
                     "draft_ms_per_round": round(draft, 2),
                     "verify_ms_per_round": round(statistics.median(r["verify_ms"] for r in runs), 2),
                     "round_ms": round(round_ms, 2), "draft_share": round(draft / round_ms, 3),
                     "rounds_per_pass": runs[0]["rounds"], "passes": runs})
    write_json(args.out, {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "command": "python benchmarks/draft_cost/bench_draft_cost.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "hardware": describe_hardware(hardware_record("cpu")), "dtype": str(target.model.dtype),
        "commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "prompts": len(prompts), "new_tokens": args.new_tokens, "rows": rows})
    for row in rows:
        print(f"{row['case']:40s} draft {row['draft_ms_per_round']:6.2f} ms  round "
              f"{row['round_ms']:6.1f} ms  share {row['draft_share']:.1%}")


if __name__ == "__main__":
    main()
