#!/usr/bin/env bash
# What prompt lookup adds to a trained drafter (the `drafter_lookup` hybrid): the quickstart's
# EAGLE-3 drafter evaluated next to plain decoding, prompt lookup and the drafter's own dynamic
# tree on the benchmark's prompts and settings (10 per set, MT-bench with both turns, 48 new
# tokens, greedy, trees autotuned on this machine), once per --hybrid-min-ngram given (each run
# with its own plain decoding, so every speedup is measured in its own run). Writes
# benchmarks/hybrid/<cpu>/min-ngram-N/ (eval.json, plots). A benchmark, not a test.
# Needs the quickstart's drafter: bash scripts/quickstart.sh first.
# Usage: bash benchmarks/hybrid/bench_hybrid.sh [N ...]   (default: 2 3; ~10 minutes per N on 2
# cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
drafter=runs/quickstart/export
if [[ ! -f "$drafter/config.json" ]]; then
  echo "error: $drafter is missing: run the quickstart first (bash scripts/quickstart.sh)" >&2
  exit 1
fi
# the machine in the folder name: CPU model, and whether it has native bf16
model=$(lscpu | sed -n 's/^Model name: *//p' | head -1 | tr '[:upper:]' '[:lower:]' \
  | sed -E 's/\([^)]*\)//g; s/[^a-z0-9]+/-/g; s/^-|-$//g')
isa=$(grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo native-bf16 || echo no-native-bf16)
if [[ $# -eq 0 ]]; then set -- 2 3; fi
for min_ngram in "$@"; do
  .venv/bin/draftsmith eval --target smollm2-135m-instruct --drafter "$drafter" \
    --methods plain,prompt_lookup,drafter_dynamic,drafter_lookup --hybrid-min-ngram "$min_ngram" \
    --bench mt_bench,humaneval,gsm8k --limit 10 --max-new-tokens 48 --tree-topk 3 \
    --tree-depth 4 --tree-total-tokens auto \
    --out "benchmarks/hybrid/$model-$isa/min-ngram-$min_ngram"
done
