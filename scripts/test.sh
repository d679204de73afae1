#!/usr/bin/env bash
# Lint and run the test suite (after scripts/setup.sh). Extra arguments go to pytest.
# dtype `auto` gives the same answer on every CPU kind in the tests (tests/conftest.py): the whole
# suite runs with the bf16 probe answering float32, then the fast selection again with it
# answering bf16 (as on a CPU with fast native bf16), so no test depends on the machine's CPU.
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
.venv/bin/ruff check draftsmith tests scripts benchmarks
# the machine and the time of each phase, so a slow run's log says where its time went
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs || true)
isa=$(grep -o -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | xargs || true)
echo "== $(date -u +%H:%M:%S) on ${cpu:-an unknown CPU}, $(nproc) cores, bf16 ISA: ${isa:-none}" >&2
# the suite needs ~9 GB of disk at its peak (7 GB of venv, vLLM's CPU build and models, 1.3 GB
# of tests' files; measured on a fresh clone): a full disk fails tests
echo "== disk free: $(df -h --output=avail "${TMPDIR:-/tmp}" | tail -1 | xargs) in ${TMPDIR:-/tmp}," \
  "$(df -h --output=avail . | tail -1 | xargs) here" >&2
echo "== $(date -u +%H:%M:%S) pytest, the bf16 probe answering float32" >&2
DRAFTSMITH_BF16_PROBE=float32 .venv/bin/python -m pytest -q --durations=15 "$@"
echo "== $(date -u +%H:%M:%S) pytest -m 'not slow', the bf16 probe answering bf16" >&2
status=0
DRAFTSMITH_BF16_PROBE=bf16 .venv/bin/python -m pytest -q -m "not slow" "$@" || status=$?
echo "== $(date -u +%H:%M:%S) done" >&2
if [[ $status -ne 0 && $status -ne 5 ]]; then exit "$status"; fi  # 5: the selection had no fast test
