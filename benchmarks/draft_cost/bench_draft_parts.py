"""Where a block drafter's draft time goes inside the decoding loop, part by part, on this machine:
a benchmark (not a test) written to a JSON file.

    .venv/bin/python benchmarks/draft_cost/bench_draft_parts.py \
        --drafter runs/abl/train/block4l1/drafter --out benchmarks/draft_cost/parts-NAME.json

A trained DFlash or DSpark drafter decodes the first turns of GSM8K and MT-bench prompts through
`draftsmith.decoding.generate` (the loop the evaluation times) as a chain and as a best-first tree;
the drafter's parts (`draft_block`, `draft_logits`, `context_kv`, `target_feature`, the tree) and
the target's verify forward are timed per call in place. Set against the same parts timed in a
tight loop (the `isolated` case: back to back on the last prompt's context), it tells whether the draft is bound by
re-reading its weights after each target forward.
"""

from __future__ import annotations

import argparse
import collections
import time

from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers import block_drafter
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.eval.methods import make_drafter_proposer
from draftsmith.eval.prompts.files import gather_prompts
from draftsmith.eval.prompts.sets import chosen_sets
from draftsmith.eval.settings import DecodeSettings
from draftsmith.export.load import load_any_drafter
from draftsmith.files import write_json
from draftsmith.provenance import git_commit
from draftsmith.serving.serve_check import prompt_token_ids
from draftsmith.target.load import load_target
from draftsmith.target.precision import describe_hardware, hardware_record

PARTS = ("draft_block", "draft_logits", "context_kv", "target_feature")


def timed(obj, name: str, label: str, times: dict, calls: collections.Counter) -> None:
    """Replace obj.name with a wrapper that adds its wall time to times[label]."""
    inner = getattr(obj, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        times[label] += time.perf_counter() - start
        calls[label] += 1
        return out

    setattr(obj, name, wrapper)


def isolated(module, proposer, repeats: int = 200) -> dict:
    """The same parts called back to back on the last prompt's context (nothing evicts the
    drafter's weights between calls): ms per call, median of 5 rounds of `repeats`."""
    import statistics

    import torch

    context = proposer.context  # inference tensors: used in inference mode only
    length = context.length
    anchor = torch.tensor(1)
    rows = module.fc.weight.new_zeros(2, module.fc.weight.shape[0])
    positions = torch.arange(length, length + 2)
    result = {}
    with torch.inference_mode():
        hidden = module.draft_block(anchor, context)
        work = {"draft_block": lambda: module.draft_block(anchor, context),
                "draft_logits": lambda: module.draft_logits(hidden),
                "context_kv": lambda: module.context_kv(rows, positions)}
        for name, call in work.items():
            rounds = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(repeats):
                    call()
                rounds.append((time.perf_counter() - start) * 1e3 / repeats)
            result[name] = round(statistics.median(rounds), 3)
    return {"ms_per_call": result, "repeats": repeats}


def weight_bytes(model, skip_input_embeddings: bool = True) -> int:
    """Bytes of the weights one forward reads: every distinct parameter, less an input embedding
    table that is not also the output head (a forward reads only its rows)."""
    seen, total = set(), 0
    embeddings = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    for parameter in model.parameters():
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        if skip_input_embeddings and parameter is embeddings and parameter is not head:
            continue
        total += parameter.numel() * parameter.element_size()
    return total


def drafter_bytes(module) -> int:
    """Bytes of the drafter's weights one round reads: all but its frozen embedding table (of which
    a block reads two rows)."""
    return sum(p.numel() * p.element_size() for name, p in module.named_parameters()
               if not name.startswith("embed_tokens"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", required=True, help="a trained DFlash / DSpark drafter folder")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto",
                        help="auto: bf16 only where this machine measures it faster")
    parser.add_argument("--limit", type=int, default=5, help="prompts per set (gsm8k, mt_bench)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    target = load_target(args.target, dtype=args.dtype)
    loaded = load_any_drafter(args.drafter, target.model)
    times: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    for part in PARTS:
        timed(loaded.module, part, part, times, calls)
    timed(block_drafter, "best_first_tree", "best_first_tree", times, calls)
    runner = CausalLMRunner(target.model, output_hidden_states=True)
    timed(runner, "forward", "target_forward", times, calls)
    settings = DecodeSettings(tree_topk=3, tree_depth=3, tree_total_tokens=6)
    prompts = prompt_token_ids(target.tokenizer, gather_prompts(
        chosen_sets("gsm8k,mt_bench", False), (), args.limit))
    cases = {}
    for method in ("drafter_dynamic", "drafter_chain"):
        times.clear()
        calls.clear()
        proposer = make_drafter_proposer(method, loaded, settings)
        for name in ("propose", "observe"):
            timed(proposer, name, name, times, calls)
        total = draft = 0.0
        for ids in prompts:
            result = generate(runner, proposer, ids, args.max_new_tokens, target.eos_token_ids)
            total, draft = total + result.total_seconds, draft + result.draft_seconds
        cases[method] = {"draft_share": round(draft / total, 4),
                         "ms_per_call": {k: round(times[k] * 1e3 / calls[k], 3) for k in times},
                         "calls": dict(calls)}
        print(f"{method}: draft share {draft / total:.1%}; ms per call: "
              + ", ".join(f"{k} {v}" for k, v in cases[method]["ms_per_call"].items()))
    cases["isolated"] = isolated(loaded.module, proposer)
    print("isolated (tight loop, weights stay in cache): ms per call: "
          + ", ".join(f"{k} {v}" for k, v in cases["isolated"]["ms_per_call"].items()))
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    read = {"drafter_mb": round(drafter_bytes(loaded.module) / 1e6, 2),
            "target_mb": round(weight_bytes(target.model) / 1e6, 2)}
    read["ratio"] = round(read["drafter_mb"] / read["target_mb"], 4)
    print(f"weights read per round: drafter {read['drafter_mb']} MB, target forward "
          f"{read['target_mb']} MB ({read['ratio']:.1%})")
    write_json(args.out, {"drafter": args.drafter, "target": args.target, "dtype": dtype,
                          "weights_read_per_round": read,
                          "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                          "tree": {"topk": 3, "depth": 3, "total_tokens": 6}, "cases": cases,
                          "hardware": hardware_record(), "machine": describe_hardware(hardware_record()),
                          "commit": git_commit()})


if __name__ == "__main__":
    main()
