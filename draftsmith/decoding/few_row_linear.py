"""Few-row float32 linears on CPU at close to one row's cost: cheap verification of short drafts.

Verifying k drafted tokens is one target forward of k + 1 rows. It pays only when that forward
costs little more than a one-row forward, as it does when reading the weights dominates. On some
CPUs torch's float32 `linear` for 2-8 rows takes a small-M sgemm path that runs close to row by
row: seen on a 2-core AVX2 AMD EPYC with MKL, a SmolLM2-135M forward of 2 tokens costs 1.7x one
token's, so no drafter could pay there. The same product computed as `(W @ x.T).T` ("skinny"
orientation: the few rows become the GEMM's narrow side) streams each weight once for all rows:
on that machine the 2-token forward then costs 1.08x, 4 tokens 1.15x, 8 tokens 1.41x.

Whether and up to how many rows the skinny form is faster depends on the CPU, the BLAS and the
weight's shape, so it is measured: a probe per weight shape (cold weights, as in a real forward),
cached per machine in the draftsmith cache, gives the largest row count up to which the skinny
form wins at every probed size. Both forms are exact float32 products of the same operands; like
any two BLAS paths (one row already takes gemv, several rows gemm) they may round differently in
the last bits, which changes the output only where two logits tie at float32 precision.
"""

from __future__ import annotations

import contextlib
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.files import read_json_dict, write_json
from draftsmith.target.precision import machine_key

PROBE_ROWS = (2, 3, 4, 6, 8, 12, 16, 24, 32)
WIN_MARGIN = 0.9  # the skinny form must take at most this share of the default's time
COLD_BYTES = 48 << 20  # weight copies cycled through so each product reads from memory, not cache
_ATTR = "_draftsmith_few_rows"


def _probe_file() -> Path:
    from draftsmith.target.offline_models import cache_dir

    return cache_dir() / "machine" / "few_row_linear.json"


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """`F.linear(x, weight, bias)` computed as `(weight @ x.T).T` (same product, other GEMM shape)."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.mm(weight, rows.t()).t().contiguous()
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _best_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_skinny_rows(out_features: int, in_features: int, rows: tuple[int, ...] = PROBE_ROWS,
                        repeats: int = 3) -> dict[int, float]:
    """Skinny time / default time of a float32 (rows, in) x (out, in) product, per row count."""
    generator = torch.Generator().manual_seed(0)
    copies = min(256, max(1, COLD_BYTES // (4 * out_features * in_features)))
    weights = [torch.randn(out_features, in_features, generator=generator) for _ in range(copies)]
    ratios = {}
    with torch.inference_mode():
        for n in rows:
            x = torch.randn(n, in_features, generator=generator)
            default = _best_seconds(lambda x=x: [F.linear(x, w) for w in weights], repeats)
            skinny = _best_seconds(lambda x=x: [skinny_linear(x, w) for w in weights], repeats)
            ratios[n] = skinny / max(default, 1e-12)
    return ratios


def max_skinny_rows(ratios: dict[int, float], margin: float = WIN_MARGIN) -> int:
    """The largest probed row count up to which the skinny form wins at every probed size (0: never)."""
    best = 0
    for n in sorted(ratios):
        if ratios[n] > margin:
            break
        best = n
    return best


def probe_shapes(shapes: set[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """`max_skinny_rows` per (out, in) weight shape on this machine; measured once, then cached."""
    path = _probe_file()
    cached = read_json_dict(path)
    machine = cached.setdefault(machine_key(), {})
    result, changed = {}, False
    for out_features, in_features in sorted(shapes):
        key = f"{out_features}x{in_features}"
        if not isinstance(machine.get(key), dict):
            ratios = measure_skinny_rows(out_features, in_features)
            machine[key] = {"ratios": {str(n): round(r, 3) for n, r in ratios.items()},
                            "max_rows": max_skinny_rows(ratios)}
            changed = True
        result[(out_features, in_features)] = int(machine[key]["max_rows"])
    if changed:
        with contextlib.suppress(OSError):  # a read-only cache costs the probe again next time
            write_json(path, cached, indent=1)
    return result


def _few_row_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // max(x.shape[-1], 1)
    if 2 <= rows <= getattr(self, _ATTR) and x.dtype == torch.float32 and x.device.type == "cpu":
        return skinny_linear(x, self.weight, self.bias)
    return F.linear(x, self.weight, self.bias)


def _float32_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    # a quantized weight (torchao's tensor subclasses) reports float32 but has no plain `mm`
    return [m for m in model.modules() if type(m) is torch.nn.Linear
            and type(m.weight) is torch.nn.Parameter
            and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]


def has_float32_linears(model: torch.nn.Module) -> bool:
    """Whether the few-row form can apply to `model` at all (float32 CPU linears)."""
    return bool(_float32_linears(model))


def install_few_row_linear(model: torch.nn.Module, max_rows: int | None = None) -> int:
    """Let the model's float32 CPU linears take the skinny form for the row counts where it wins.

    Args:
        model: a float32 model on the CPU (anything else is left untouched).
        max_rows: force one limit for every linear (tests; 0 turns the skinny form off);
            None measures it per weight shape (cached per machine).

    Returns:
        The number of linears that take the skinny form for some row count.
    """
    linears = _float32_linears(model)
    if not linears:
        return 0
    limits = (probe_shapes({tuple(m.weight.shape) for m in linears}) if max_rows is None
              else {tuple(m.weight.shape): max_rows for m in linears})
    installed = 0
    for module in linears:
        limit = limits[tuple(module.weight.shape)]
        setattr(module, _ATTR, limit)
        if limit >= 2:
            module.forward = types.MethodType(_few_row_forward, module)
            installed += 1
        elif "forward" in module.__dict__:
            del module.forward
    return installed


def few_row_limits(model: torch.nn.Module) -> dict[str, int]:
    """Installed row limits by weight shape (`"576x1536": 8`), for reports."""
    return {f"{m.weight.shape[0]}x{m.weight.shape[1]}": getattr(m, _ATTR)
            for m in model.modules() if hasattr(m, _ATTR)}
