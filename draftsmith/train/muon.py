"""Muon with its Newton-Schulz orthogonalisation in a dtype chosen for the machine.

`torch.optim.Muon` runs the five Newton-Schulz steps in bfloat16 always (as the reference code does
on GPUs). On a CPU without native bfloat16 every one of those products is emulated: on a 2-core
AVX2 EPYC the quickstart's EAGLE-3 took 25 s per step under it against about 1 s with AdamW, so a
6-minute budget bought 12 steps. `Muon` here is torch's optimizer (same parameter groups, state and
checkpoints) whose step runs the same update with the iteration in `ns_dtype`: bfloat16 on a GPU
and on a CPU where bf16 measured faster, float32 elsewhere (`newton_schulz_dtype`).
"""

from __future__ import annotations

import math

import torch


def newton_schulz_dtype(device: str | torch.device) -> torch.dtype:
    """bfloat16 on CUDA (the reference's choice) and on a CPU whose bf16 matmul measured faster
    than float32 (`precision.choose_dtype`'s probe, cached per machine); float32 elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16
    if device.type != "cpu":
        return torch.float32
    from draftsmith.target.precision import choose_dtype

    return choose_dtype("auto", "cpu").torch_dtype


def orthogonalise(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float, dtype: torch.dtype) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of `torch.optim.Muon` (Keller Jordan's), in `dtype`:
    approximately U V^T of the update's SVD, returned in `dtype`."""
    a, b, c = coefficients
    x = update.to(dtype)
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, rule: str | None, shape: torch.Size) -> float:
    """`torch.optim.Muon`'s learning-rate scaling by the matrix's shape."""
    rows, cols = shape[:2]
    if rule in (None, "original"):
        return lr * math.sqrt(max(1, rows / cols))
    if rule == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


class Muon(getattr(torch.optim, "Muon", torch.optim.Optimizer)):  # torch < 2.9: refused earlier
    """`torch.optim.Muon` with the orthogonalisation in `ns_dtype` (see the module docstring)."""

    def __init__(self, params, *, ns_dtype: torch.dtype, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.ndim != 2:
                    raise ValueError("Muon takes 2-D matrices only")
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(param.grad, 1 - group["momentum"])
                update = param.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                update = orthogonalise(update, group["ns_coefficients"], group["ns_steps"],
                                       group["eps"], self.ns_dtype)
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update.to(param.dtype),
                           alpha=-adjusted_lr(lr, group["adjust_lr_fn"], param.shape))
        return loss
