#!/usr/bin/env bash
# Set up draftsmith on a fresh machine: a virtual environment in .venv with torch, the project and its
# dev extra, then the offline default target (SmolLM2-135M-Instruct) fetched, verified and converted.
# Idempotent: a second run only checks. Usage: bash scripts/setup.sh [--fresh]
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--fresh" ]]; then rm -rf .venv; fi
if [[ ! -x .venv/bin/python ]]; then
  echo "== creating .venv" >&2
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # CPU build that lies on this machine's disk; an unpinned torch pulls a multi-GB CUDA build.
  # On a GPU machine install the torch build you want first; this step is then skipped.
  echo "== installing torch" >&2
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
echo "== installing draftsmith[dev]" >&2
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "== fetching the offline default target" >&2
.venv/bin/draftsmith models fetch smollm2-135m-instruct >/dev/null
echo "== setup done: activate with 'source .venv/bin/activate'" >&2
