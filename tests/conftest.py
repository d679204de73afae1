"""Shared fixtures: tiny random targets for every family, and the offline real models."""

from __future__ import annotations

import pytest

from tests.helpers.state import reset_accelerate
from tests.helpers.tiny_targets import FAMILIES, tiny_target


@pytest.fixture(params=FAMILIES)
def tiny_model(request):
    """A tiny random target, once per family (Llama, Qwen2)."""
    return tiny_target(request.param)


@pytest.fixture
def fresh_accelerate_state():
    """Tests that create Accelerators in this process start and end with a clean state."""
    reset_accelerate()
    yield
    reset_accelerate()
