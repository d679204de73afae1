#!/usr/bin/env bash
# Lint and run the test suite (after scripts/setup.sh). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The speculators package is the peer loader of the EAGLE-3 compatibility test. Its declared
# dependencies pull GPU builds of torchvision/torchaudio, so it goes in without them (test-only).
if ! .venv/bin/python -c "import speculators" 2>/dev/null; then
  echo "== installing speculators for the compatibility test" >&2
  .venv/bin/python -m pip install --quiet --no-deps speculators==0.9.0 hs-connectors==0.9.0
  .venv/bin/python -m pip install --quiet openai aiohttp httpx pydantic pydantic-settings loguru \
    rich typer click psutil
fi
.venv/bin/ruff check draftsmith tests scripts
.venv/bin/python -m pytest -q "$@"
