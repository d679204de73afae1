"""Shared fixtures: tiny random targets for every family, and the offline real models."""

from __future__ import annotations

import os

import pytest

from draftsmith import offline_models

from tiny_targets import FAMILIES, tiny_target


@pytest.fixture(params=FAMILIES)
def tiny_model(request):
    """A tiny random target, once per family (Llama, Qwen2)."""
    return tiny_target(request.param)


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


@pytest.fixture
def fresh_accelerate_state():
    """Tests that create Accelerators in this process start and end with a clean state."""
    reset_accelerate()
    yield
    reset_accelerate()
