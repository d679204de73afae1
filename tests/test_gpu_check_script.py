"""scripts/gpu_check.py, the check a lent GPU runs, kept working between loans: its gate and
profile stages on this CPU, with the record it writes after each stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parents[1] / "scripts" / "gpu_check.py"


def test_gate_and_profile_stages_run_on_cpu(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu",
                           "--stages", "gate,profile"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    assert set(stages) == {"env", "gate", "profile"}
    greedy, sampling = stages["gate"]["greedy"], stages["gate"]["sampling"]
    assert greedy["rc"] == 0 and greedy["failures"] == [] and greedy["checked"] >= 30
    assert sampling["rc"] == 0 and sampling["failures"] == [] and sampling["checked"] >= 8
    assert "on the CPU" in greedy["guarantee"]
    profile = stages["profile"]
    assert profile["runner_ms_per_token"] > 0 and "aten::" in profile["runner_profile"]
    assert (tmp_path / "gate.log").stat().st_size > 0
