"""Process-wide state tests reset or need: accelerate's singletons, the offline real models."""

from __future__ import annotations

import os

import pytest

from draftsmith import offline_models


def require_offline_model(name: str) -> str:
    """Skip when `name` is not fetched, unless CI requires it ($DRAFTSMITH_REQUIRE_MODELS), then fail."""
    if offline_models.is_fetched(name):
        return name
    required = os.environ.get("DRAFTSMITH_REQUIRE_MODELS", "").split(",")
    message = f"offline model {name} not fetched: run `draftsmith models fetch {name}`"
    if name in required:
        pytest.fail(message)
    pytest.skip(message)


def reset_accelerate() -> None:
    """Forget accelerate's process-wide state so the next Accelerator starts fresh."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
