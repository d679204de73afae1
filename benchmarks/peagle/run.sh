#!/usr/bin/env bash
# Reproduces benchmarks/peagle/: EAGLE-3 and P-EAGLE on SmolLM2-135M-Instruct, trained for the same
# wall-clock budget on the same data run, evaluated in one run on the same prompts, then the
# P-EAGLE drafter served by vLLM's CPU build with parallel drafting beside draftsmith's loop.
set -euo pipefail
cd "$(dirname "$0")/../.."
DS=.venv/bin/draftsmith
LOCK=/tmp/draftsmith-bench.lock
OUT=runs/peagle
# one data run for both (P-EAGLE's recipe caches the same three layers for eagle3 and peagle);
# 10 cache minutes hold every conversation (500 tokens/s here: 6:52)
CACHE="data.cache.max_minutes=10"
$DS data run --config recipes/smollm2-135m/peagle.yaml --no-progress $CACHE
# the quickstart's EAGLE-3 on that data, 4 TTT steps = P-EAGLE's 4 depths, 6 minutes each; the
# schedule pinned to P-EAGLE's recipe's, so the two train sections stay equal if the quickstart's
# changes
SAME="train.schedule=wsd train.warmup_steps=30 $CACHE"
flock $LOCK $DS train --config recipes/smollm2-135m/quickstart.yaml \
  data.out_dir=$OUT/data "data.cache.kinds=[eagle3,peagle]" drafter.ttt_steps=4 \
  train.output_dir=$OUT/eagle3 $SAME
flock $LOCK $DS train --config recipes/smollm2-135m/peagle.yaml $SAME
# chains of 4 drafts (the bar's like-for-like draft count) and the default trees, one eval run
flock $LOCK $DS eval --target smollm2-135m-instruct \
  --drafter eagle3=$OUT/eagle3/drafter --drafter peagle=$OUT/peagle/drafter \
  --methods plain,drafter_chain@eagle3,drafter_chain@peagle,drafter_dynamic@eagle3,drafter_dynamic@peagle \
  --num-draft-tokens 4 --tree-depth 4 --tree-topk 3 --tree-total-tokens 8 \
  --bench mt_bench,humaneval,gsm8k --limit 4 --max-new-tokens 48 --out $OUT/eval
.venv/bin/python benchmarks/peagle/summarize.py $OUT/eval/eval.json benchmarks/peagle/results.json
flock $LOCK .venv/bin/python benchmarks/peagle/serve_vllm.py $OUT/peagle/drafter $OUT/serve \
  --limit 4 --max-new-tokens 64
cp $OUT/serve/serve_vllm.json benchmarks/peagle/serve_vllm_trained.json
