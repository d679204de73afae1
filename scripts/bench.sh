#!/usr/bin/env bash
# The benchmark behind BENCHMARKS.md: for each target, one shared data preparation, every drafter
# kind trained for the same wall-clock budget, then every method (trained drafters, prompt lookup,
# the classic draft model) side by side at each configured temperature; BENCHMARKS.md and the plots
# under benchmarks/ are regenerated from the results, keeping the committed results of a target
# not run this time. Resumable: run it again and finished stages are skipped, and an interrupted
# training resumes from its last checkpoint. On 2 CPU cores SmolLM2 takes about 2 hours and
# Qwen2.5-Coder-1.5B about 1 more: one target per sitting, e.g.
#   bash scripts/bench.sh recipes/bench/qwen2.5-coder-1.5b.yaml
# Usage: bash scripts/bench.sh [recipes/bench/X.yaml ...]   (default: both targets)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
configs=("$@")
if [[ ${#configs[@]} -eq 0 ]]; then
  configs=(recipes/bench/smollm2-135m.yaml recipes/bench/qwen2.5-coder-1.5b.yaml)
fi
# the verify-cost curve of this machine (dtype chosen, few-row linear off/on) heads BENCHMARKS.md
.venv/bin/draftsmith machine --target smollm2-135m-instruct --out benchmarks/machine
args=()
for config in "${configs[@]}"; do
  if [[ "$config" == *qwen2.5-coder-1.5b* ]]; then
    .venv/bin/draftsmith models fetch qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct
  fi
  args+=(--config "$config")
done
.venv/bin/draftsmith bench "${args[@]}"
