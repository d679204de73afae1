"""Serve a trained P-EAGLE drafter in vLLM's CPU build with parallel drafting, beside draftsmith's
own loop on the same prompts (float32, greedy), in both export layouts.

    .venv/bin/python benchmarks/peagle/serve_vllm.py DRAFTER_DIR OUT_DIR [--limit N]

`draftsmith serve-check` serves a kind under its registry method alone (`{"method": "eagle3"}`),
and vLLM only drafts in parallel when the speculative config also says `"parallel_drafting":
true`: without it vLLM skips `mask_hidden` and drafts autoregressively, another drafter. So this
script builds serve-check's runs itself with that key: one plain vLLM run, one speculative run per
layout, and draftsmith's loop with a chain of the same length. It writes OUT_DIR/serve_vllm.json:
per layout whether the outputs equal plain decoding, the engine's tau and acceptance per draft
position, the loop's, and the largest per-position gap.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.eval.prompts.sets import load_prompts
from draftsmith.eval.settings import DecodeSettings
from draftsmith.export import export_drafter
from draftsmith.serving.serve_check import (
    ServeCheckSettings,
    engine_acceptance,
    prompt_token_ids,
    run_vllm,
)
from draftsmith.serving.serve_check_loop import loop_acceptance
from draftsmith.serving.serve_check_run import target_folder
from draftsmith.target.load import load_target

TARGET = "smollm2-135m-instruct"
LAYOUTS = ("peagle", "peagle-speculators")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafter", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int, default=4, help="prompts per built-in set")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma list of "
                        f"{', '.join(LAYOUTS)}")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = json.loads((args.drafter / "draftsmith_drafter.json").read_text())
    depth = int(meta["drafter_config"]["num_depths"])
    target_dir = target_folder(TARGET)
    target = load_target(TARGET, dtype="float32")
    prompts = [p for name in ("mt_bench", "humaneval", "gsm8k")
               for p in load_prompts(name, limit=args.limit)]
    ids = prompt_token_ids(target.tokenizer, prompts)
    settings = ServeCheckSettings(draft_max=depth, max_new_tokens=args.max_new_tokens,
                                  engine="vllm", dtype="float32", loop=True)
    plain = run_vllm(target_dir, ids, settings, args.out / "engine_plain.log", dtype="float32")
    report = {"target": TARGET, "prompts": len(ids), "max_new_tokens": args.max_new_tokens,
              "num_speculative_tokens": depth, "dtype": "float32", "layouts": {}}
    for layout in args.layouts.split(","):
        export = export_drafter(args.drafter, layout, args.out / f"export-{layout}",
                                overwrite=True)
        speculative = {"method": "eagle3", "model": str(export.resolve()),
                       "parallel_drafting": True, "num_speculative_tokens": depth}
        spec = run_vllm(target_dir, ids, settings, args.out / f"engine_{layout}.log",
                        speculative, dtype="float32")
        engine = engine_acceptance(spec, depth, "vllm")
        loop = loop_acceptance(target, export, ids, args.max_new_tokens,
                               DecodeSettings(num_draft_tokens=depth))
        identical = [int(a.tokens == b.tokens) for a, b in zip(plain.answers, spec.answers,
                                                                strict=True)]
        gaps = [abs(a - b) for a, b in zip(engine["acceptance_per_position"],
                                           loop["acceptance_per_position"], strict=True)]
        report["layouts"][layout] = {
            "speculative_config": speculative, "identical_to_plain": identical,
            "engine": engine, "loop": {k: v for k, v in loop.items() if k != "answers"},
            "loop_same_answer_as_engine": [int(a == b.tokens) for a, b in
                                           zip(loop["answers"], spec.answers, strict=True)],
            "largest_position_gap": round(max(gaps), 4)}
        print(layout, json.dumps({k: report["layouts"][layout][k] for k in
                                  ("identical_to_plain", "largest_position_gap")}),
              engine["acceptance_per_position"], loop["acceptance_per_position"], flush=True)
    (args.out / "serve_vllm.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
