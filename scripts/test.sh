#!/usr/bin/env bash
# Lint and run the test suite (after scripts/setup.sh). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check draftsmith tests scripts
.venv/bin/python -m pytest -q "$@"
