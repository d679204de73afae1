#!/usr/bin/env bash
# What a longer training budget buys (issue #13): the SmolLM2 benchmark's EAGLE-3 recipe trained
# again on the benchmark's own data for K times its calibrated steps (warmup, held-out and
# checkpoint intervals scaled alike), then evaluated in one run next to the benchmark's drafter,
# prompt lookup and plain decoding on the benchmark's prompts and settings (10 per set, 48 new
# tokens, greedy, trees autotuned on this machine). Writes benchmarks/budget/smollm2-eagle3-xK/
# (eval.json, plots, the recipe and the training's metrics). A benchmark, not a test.
# Needs the SmolLM2 benchmark's data and EAGLE-3 drafter: bash scripts/bench.sh first.
# Usage: bash benchmarks/budget/bench_budget.sh [K]   (default 2: ~18 minutes of training on 2
# cores, then ~10 minutes of evaluation)
set -euo pipefail
cd "$(dirname "$0")/../.."
factor="${1:-2}"
bench=runs/bench/smollm2-135m-instruct
short="$bench/train/eagle3"
long="$bench/train/eagle3-x$factor"
out="benchmarks/budget/smollm2-eagle3-x$factor"
for need in "$bench/recipes/eagle3.yaml" "$short/drafter/model.safetensors"; do
  if [[ ! -f "$need" ]]; then
    echo "error: $need is missing: run the SmolLM2 benchmark first (bash scripts/bench.sh recipes/bench/smollm2-135m.yaml)" >&2
    exit 1
  fi
done
mkdir -p "$out"
.venv/bin/python - "$bench/recipes/eagle3.yaml" "$out/recipe.yaml" "$factor" "$long" <<'EOF'
import sys
import yaml
source, dest, factor, output_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
recipe = yaml.safe_load(open(source))
train = recipe["train"]
for key in ("max_steps", "warmup_steps", "eval_every", "save_every"):
    train[key] = int(train[key]) * factor
train["output_dir"] = output_dir
open(dest, "w").write(f"# {source} with {factor}x its steps (benchmarks/budget/bench_budget.sh)\n"
                      + yaml.safe_dump(recipe, sort_keys=False))
EOF
if [[ ! -f "$long/drafter/model.safetensors" ]]; then  # an interrupted run resumes
  .venv/bin/python -m draftsmith.train --config "$out/recipe.yaml"
fi
cp "$long/metrics.jsonl" "$out/metrics.jsonl"
.venv/bin/draftsmith eval --target smollm2-135m-instruct \
  --drafter "x1=$short/drafter" --drafter "x$factor=$long/drafter" \
  --methods "plain,prompt_lookup,drafter_dynamic@x1,drafter_dynamic@x$factor" \
  --limit 10 --max-new-tokens 48 --num-draft-tokens 3 --tree-topk 3 --tree-depth 4 \
  --tree-total-tokens auto --out "$out"
