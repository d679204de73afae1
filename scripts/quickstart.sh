#!/usr/bin/env bash
# The main job on a fresh machine: set up, load the offline default target (SmolLM2-135M-Instruct),
# generate once, then evaluate speculative decoding against plain decoding and Hugging Face's
# baselines on MT-bench / HumanEval / GSM8K prompts. Prints the table and where the plots are.
# It grows into "train a drafter, evaluate it, print the table" as training lands (issue #7).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/draftsmith generate --target smollm2-135m-instruct --dtype bfloat16 \
  --prompt "Explain speculative decoding in two sentences." --max-new-tokens 80
.venv/bin/draftsmith eval --target smollm2-135m-instruct --dtype bfloat16 \
  --bench mt_bench,humaneval,gsm8k --limit 2 --max-new-tokens 96 \
  --methods plain,prompt_lookup,hf_generate,hf_prompt_lookup --out runs/quickstart
