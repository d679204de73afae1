#!/usr/bin/env bash
# Train every drafter kind on SmolLM2-135M-Instruct for the same short CPU budget on the data the
# quickstart prepared (runs/quickstart/data), then print each kind's held-out top-1 accuracy per
# draft position against the target and the simulated acceptance length.
# Usage: bash scripts/train_every_kind.sh [STEPS] [KINDS]   (after scripts/quickstart.sh)
#   KINDS: recipe names in recipes/smollm2-135m/, default "medusa1 medusa2 eagle1 mtp eagle3"
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-60}
KINDS=${2:-medusa1 medusa2 eagle1 mtp eagle3}
DATA=runs/quickstart/data/tokenized.jsonl
[[ -f $DATA ]] || { echo "run scripts/quickstart.sh first ($DATA is missing)" >&2; exit 2; }
rm -rf runs/every_kind
for kind in $KINDS; do
  .venv/bin/draftsmith train --config recipes/smollm2-135m/$kind.yaml data.tokenized=$DATA \
    train.max_steps=$STEPS train.warmup_steps=6 train.batch_size=4 train.max_length=320 \
    train.lr=5e-4 train.eval_every=0 train.save_every=0 train.eval_fraction=0.1 \
    train.output_dir=runs/every_kind/$kind >/dev/null
done
.venv/bin/python - <<'PY'
import json, pathlib
for folder in sorted(pathlib.Path("runs/every_kind").iterdir()):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in rows if "eval/simulated_tau" in r][-1]
    accs = [final[f"eval/acc_{k}"] for k in range(8) if f"eval/acc_{k}" in final]
    seconds = max(r.get("seconds", 0) for r in rows)
    print(f"{folder.name:8s} steps {final['step']:4d}  {seconds / 60:4.1f} min  held-out acc per "
          f"position {[round(a, 3) for a in accs]}  simulated tau {final['eval/simulated_tau']:.2f}")
PY
