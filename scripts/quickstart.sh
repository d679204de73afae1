#!/usr/bin/env bash
# The main job on a fresh machine (2 CPU cores, ~20 minutes): set up, answer a slice of ShareGPT
# with the offline default target (SmolLM2-135M-Instruct), train an EAGLE-3 drafter on it, and
# evaluate it against plain decoding and prompt lookup on MT-bench / HumanEval / GSM8K prompts.
# Prints the table and where the JSON and plots are. Every step resumes when run again.
# With a GPU and a bigger target the same flow is one recipe away, e.g.
#   accelerate launch --config_file recipes/accelerate/ddp.yaml -m draftsmith.train \
#       --config recipes/llama-3.1-8b/eagle3.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=runs/quickstart
.venv/bin/draftsmith train --config recipes/smollm2-135m/eagle3.yaml \
  data.limit=320 data.max_length=320 data.regenerate.max_new_tokens=128 data.out_dir=$OUT/data \
  train.max_steps=160 train.warmup_steps=16 train.batch_size=4 train.max_length=320 \
  train.lr=5e-4 train.eval_every=0 train.save_every=40 train.output_dir=$OUT/eagle3
.venv/bin/draftsmith eval --target smollm2-135m-instruct --dtype bfloat16 \
  --drafter $OUT/eagle3/drafter --methods plain,drafter,prompt_lookup \
  --bench mt_bench,humaneval,gsm8k --limit 2 --max-new-tokens 96 --out $OUT/eval
