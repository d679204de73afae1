#!/usr/bin/env bash
# The main job on a fresh machine (2 CPU cores, <= 25 minutes on CPUs with or without native
# bf16): set up, fetch the offline default target (SmolLM2-135M-Instruct), answer ShareGPT prompts
# with it (through llama.cpp's server, started on the target's GGUF and stopped after), cache its
# hidden states and train an EAGLE-3 drafter, each phase for a wall-clock
# budget measured on this machine (recipes/smollm2-135m/quickstart.yaml), export it in the EAGLE-3
# format vLLM/SGLang load, and evaluate the export (its dynamic tree, and with prompt lookup as the
# drafter_lookup hybrid) against plain decoding and prompt lookup on MT-bench / HumanEval / GSM8K
# prompts (2 per set: a quick check; BENCHMARKS.md has the numbers).
# Prints the table and where the JSON and plots are. Every step resumes when run again.
# With a GPU and a bigger target the same flow is one recipe away:
#   accelerate launch --config_file recipes/accelerate/ddp.yaml -m draftsmith.train \
#       --config recipes/llama-3.1-8b/eagle3.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
OUT=runs/quickstart
.venv/bin/draftsmith train --config recipes/smollm2-135m/quickstart.yaml
.venv/bin/draftsmith export "$OUT/eagle3/drafter" --format eagle3 --out "$OUT/export" --force
.venv/bin/draftsmith eval --target smollm2-135m-instruct \
  --drafter "$OUT/export" --methods plain,drafter_dynamic,drafter_lookup,prompt_lookup \
  --num-draft-tokens 3 --tree-topk 3 --tree-total-tokens auto \
  --bench mt_bench,humaneval,gsm8k --limit 2 --max-new-tokens 96 --out "$OUT/eval"
# the model card of the export now carries the measured numbers
.venv/bin/draftsmith export "$OUT/eagle3/drafter" --format eagle3 --out "$OUT/export" --force \
  --eval-json "$OUT/eval/eval.json" >/dev/null
echo "quickstart done in $(( ($(date +%s) - start) / 60 )) min; drafter: $OUT/eagle3/drafter," \
  "EAGLE-3 export: $OUT/export"
