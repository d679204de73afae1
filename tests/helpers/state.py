"""Process-wide state tests reset or need: accelerate's singletons, the offline real models."""

from __future__ import annotations

import os

import pytest

from draftsmith.target import offline_models


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


def killed_at_step(monkeypatch, step: int, run, *args, **kwargs) -> None:
    """Call `run(*args, **kwargs)`, a training run, killed as it logs step `step` (the metrics log
    raises KeyboardInterrupt, as Ctrl-C mid-run would), then restore the log and accelerate's
    state for the run that resumes it."""
    from draftsmith.train import metrics as metrics_module

    original = metrics_module.MetricsLog.write

    def crash(self, row):
        if row.get("step") == step and "loss" in row:
            raise KeyboardInterrupt("simulated kill")
        original(self, row)

    monkeypatch.setattr(metrics_module.MetricsLog, "write", crash)
    with pytest.raises(KeyboardInterrupt):
        run(*args, **kwargs)
    monkeypatch.setattr(metrics_module.MetricsLog, "write", original)
    reset_accelerate()
