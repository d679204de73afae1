"""Draft time per round: P-EAGLE's one forward against EAGLE-3's one forward per depth, at the same
number of drafted tokens, on SmolLM2-135M-Instruct's own features.

    flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/peagle/draft_time.py OUT_JSON

Both drafters have the SmolLM2 recipes' shapes (8,192-token draft vocabulary, the default fused
layers; P-EAGLE with 4 depths) and start from the target's embedding and head: a drafter's cost
per round depends on its shapes, not on its weights. Every prompt is decoded greedily with a
4-draft chain by each drafter in turn (A B, then B A on the next prompt, so drift in the
machine's load falls on both); each round's drafting time is the decoding loop's own
`draft_seconds`, divided by the rounds that drafted. One torch thread.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from draftsmith.decoding.decode import generate
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.drafter_folder import LoadedDrafter
from draftsmith.eval.methods import make_drafter_proposer
from draftsmith.eval.prompts.sets import load_prompts
from draftsmith.eval.settings import DecodeSettings
from draftsmith.registry import get_spec
from draftsmith.serving.serve_check import prompt_token_ids
from draftsmith.target.load import load_target

DEPTH = 4
NEW_TOKENS = 48
KINDS = {"eagle3": {"draft_vocab_size": 8192, "ttt_steps": DEPTH},
         "peagle": {"draft_vocab_size": 8192, "num_depths": DEPTH, "mask_token_id": 16}}


def drafter(kind: str, model) -> LoadedDrafter:
    spec = get_spec(kind)
    torch.manual_seed(0)
    module = spec.build(model.config, spec.make_config(KINDS[kind]))
    module.init_from_target(model)
    return LoadedDrafter(kind, module.to(model.dtype).eval().requires_grad_(False), {})


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    target = load_target("smollm2-135m-instruct", dtype="auto")
    drafters = {kind: drafter(kind, target.model) for kind in KINDS}
    prompts = [p for name in ("mt_bench", "humaneval", "gsm8k")
               for p in load_prompts(name, limit=4)]
    ids = prompt_token_ids(target.tokenizer, prompts)
    runner = CausalLMRunner(target.model, output_hidden_states=True)
    settings = DecodeSettings(num_draft_tokens=DEPTH)
    per_prompt = {kind: [] for kind in KINDS}
    depths = {kind: [] for kind in KINDS}
    started = time.perf_counter()
    for n, prompt in enumerate(ids):
        for kind in (list(KINDS) if n % 2 == 0 else list(reversed(KINDS))):
            proposer = make_drafter_proposer("drafter_chain", drafters[kind], settings)
            result = generate(runner, proposer, prompt, NEW_TOKENS)
            drafted = [d for d in result.depth_per_step if d > 0]
            per_prompt[kind].append(1e3 * result.draft_seconds / len(drafted))
            depths[kind] += drafted
    ratios = [p / e for p, e in zip(per_prompt["peagle"], per_prompt["eagle3"], strict=True)]
    report = {
        "target": "smollm2-135m-instruct", "dtype": str(target.model.dtype),
        "torch_threads": 1, "prompts": len(ids), "new_tokens": NEW_TOKENS,
        "drafted_per_round": DEPTH, "seconds": round(time.perf_counter() - started, 1),
        "draft_ms_per_round": {k: {"median": round(statistics.median(v), 2),
                                   "mean": round(statistics.fmean(v), 2),
                                   "per_prompt": [round(x, 2) for x in v]}
                               for k, v in per_prompt.items()},
        "mean_drafted_depth": {k: round(statistics.fmean(v), 3) for k, v in depths.items()},
        "peagle_over_eagle3": {"median_paired": round(statistics.median(ratios), 3),
                               "worst_paired": round(max(ratios), 3),
                               "per_prompt": [round(r, 3) for r in ratios]},
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("draft_ms_per_round", "peagle_over_eagle3")}))


if __name__ == "__main__":
    main()
