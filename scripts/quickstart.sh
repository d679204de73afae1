#!/usr/bin/env bash
# The main job on a fresh machine: set up, load the offline default target and generate.
# It grows into "train a drafter, evaluate it, print the table" as the pipeline lands.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/draftsmith generate --target smollm2-135m-instruct --dtype bfloat16 \
  --prompt "Explain speculative decoding in two sentences." --max-new-tokens 80
