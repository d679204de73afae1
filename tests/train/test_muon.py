"""train/muon.py: torch's Muon update with the Newton-Schulz iteration in a chosen dtype."""

from __future__ import annotations

import pytest
import torch

from draftsmith.train.muon import Muon, newton_schulz_dtype, orthogonalise

SETTINGS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}


def _steps(optimizer_class, steps=3, **extra):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in [(24, 40), (40, 24)]]
    optimizer = optimizer_class(params, **SETTINGS, **extra)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()
    return params, optimizer


def test_in_bfloat16_it_is_torch_s_muon_bit_for_bit():
    ours, optimizer = _steps(Muon, ns_dtype=torch.bfloat16)
    theirs, reference = _steps(torch.optim.Muon)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(ours, theirs, strict=True):  # the same state: checkpoints load either way
        assert torch.equal(optimizer.state[a]["momentum_buffer"],
                           reference.state[b]["momentum_buffer"])


def test_in_float32_the_update_is_the_same_orthogonalisation():
    ours, _ = _steps(Muon, ns_dtype=torch.float32)
    theirs, _ = _steps(torch.optim.Muon)
    start = _steps(Muon, steps=0, ns_dtype=torch.float32)[0]
    for a, b, p0 in zip(ours, theirs, start, strict=True):
        moved_a, moved_b = (a - p0).detach(), (b - p0).detach()
        assert a.dtype == torch.float32 and moved_a.abs().max() > 0.01
        # bfloat16 rounding is ~1e-2 relative: the two updates agree to that
        assert torch.allclose(moved_a, moved_b, rtol=0.05, atol=0.02 * float(moved_b.abs().max()))


@pytest.mark.parametrize("shape", [(16, 48), (48, 16)])
def test_the_iteration_brings_singular_values_near_one(shape):
    gen = torch.Generator().manual_seed(1)
    update = torch.randn(shape, generator=gen) * torch.logspace(-1, 0, shape[1])
    result = orthogonalise(update, (3.4445, -4.7750, 2.0315), 5, 1e-7, torch.float32)
    assert result.shape == update.shape and result.dtype == torch.float32
    singular = torch.linalg.svdvals(result)
    assert singular.min() > 0.3 and singular.max() < 1.5  # Muon's US'V^T, S' ~ U(0.5, 1.5)


def test_the_dtype_follows_the_machine(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_BF16_PROBE", "float32")  # a CPU where bf16 is emulated
    assert newton_schulz_dtype("cpu") == torch.float32
    monkeypatch.setenv("DRAFTSMITH_BF16_PROBE", "bf16")  # a CPU where bf16 measured faster
    assert newton_schulz_dtype("cpu") == torch.bfloat16
    assert newton_schulz_dtype(torch.device("cuda", 0)) == torch.bfloat16
