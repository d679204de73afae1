"""Compute precision chosen by measurement: `auto` picks bfloat16 only where the hardware runs it fast.

On CUDA, bf16 where the device supports it (float16 otherwise). On a CPU, bf16 only when the CPU
has native bf16 instructions (`avx512_bf16`, `amx_bf16`, ARM `bf16`) and a short probe of this
target's matmul shapes shows bf16 faster than float32; otherwise float32. Without native bf16,
torch emulates it and a bf16 matmul runs tens of times slower than float32, so assuming "bf16 is
fast" turns a 20-minute job into hours. The probe takes well under a second and is cached per
machine (CPU model, ISA flags, torch version, shape) in the draftsmith cache.

Every choice comes with its reason, printed once and recorded next to every measured number
(`hardware_record`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.files import read_json_dict, write_json

COMPUTE_DTYPES = ("auto", "float32", "bfloat16", "float16")
MIXED_PRECISIONS = ("auto", "no", "bf16", "fp16")
# ISA flags worth naming next to a measurement (x86 /proc/cpuinfo names; ARM `Features`)
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile",
                  "asimd", "sve", "bf16")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# bf16 must beat float32 by this factor to be chosen (a tie keeps the exact float32)
BF16_MARGIN = 0.9
# DRAFTSMITH_BF16_PROBE=bf16|float32 stands in for the probe's answer on any CPU (bf16 measured 2x
# faster on a CPU with native bf16, or 6x slower): the same choice on every machine, e.g. for a
# test suite or a comparison run across CPU kinds; `measure` (or unset) measures this CPU
PROBE_ENV = "DRAFTSMITH_BF16_PROBE"
FORCED_PROBES = {"bf16": 0.5, "float32": 6.0}
MEASURE = "measure"


@dataclass(frozen=True)
class CpuInfo:
    """The CPU's model name and ISA flags (lower case, as /proc/cpuinfo spells them)."""

    model: str
    flags: frozenset[str]

    @property
    def native_bf16(self) -> bool:
        return any(flag in self.flags for flag in NATIVE_BF16_FLAGS)

    @property
    def isa(self) -> list[str]:
        """The reported flags this CPU has, in a fixed order."""
        return [flag for flag in REPORTED_FLAGS if flag in self.flags]


@lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """Read the CPU model and flags (Linux /proc/cpuinfo; elsewhere the platform's name only)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return CpuInfo(model=model, flags=frozenset())
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and value.strip():
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.lower().split())
    return CpuInfo(model=model, flags=frozenset(flags))


@dataclass(frozen=True)
class DtypeChoice:
    """A compute dtype and why it was chosen.

    Attributes:
        dtype: `float32`, `bfloat16` or `float16`.
        reason: one line a user can read ("this CPU has no native bfloat16: ...").
        bf16_slowdown: measured bf16 time / float32 time on this machine (None: not measured).
    """

    dtype: str
    reason: str
    bf16_slowdown: float | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def mixed_precision(self) -> str:
        """The accelerate mixed-precision setting that runs a drafter in this dtype."""
        return {"float32": "no", "bfloat16": "bf16", "float16": "fp16"}[self.dtype]


def machine_key() -> str:
    """What a measurement on this machine depends on: CPU model and flags, torch, threads."""
    info = cpu_info()
    return (f"{info.model}|{','.join(sorted(info.flags))}|torch {torch.__version__}|"
            f"threads {torch.get_num_threads()}")


def _probe_path() -> Path:
    from draftsmith.target.offline_models import cache_dir

    return cache_dir() / "machine" / "bf16_probe.json"


def _time_matmul(dtype: torch.dtype, rows: int, inner: int, outer: int, budget_s: float) -> float:
    """Best seconds of one (rows, inner) @ (inner, outer) product in `dtype` within `budget_s`."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inner, generator=generator).to(dtype)
    w = torch.randn(outer, inner, generator=generator).to(dtype)
    torch.nn.functional.linear(x, w)  # warm-up
    best, deadline = float("inf"), time.perf_counter() + budget_s
    for _ in range(20):
        start = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - start)
        if start > deadline:
            break
    return best


def forced_probe() -> float | None:
    """The bf16/fp32 ratio `DRAFTSMITH_BF16_PROBE` stands in for the probe with (None: unset).

    Raises:
        DraftsmithError: a value other than `bf16` or `float32`.
    """
    value = os.environ.get(PROBE_ENV, "").strip()
    if value in ("", MEASURE):
        return None
    if value not in FORCED_PROBES:
        raise DraftsmithError(f"{PROBE_ENV}={value!r}: use one of {', '.join(FORCED_PROBES)}, "
                              f"{MEASURE} (or unset it) to measure this CPU")
    return FORCED_PROBES[value]


def measure_bf16_slowdown(hidden_size: int, intermediate_size: int, rows: int = 64,
                          budget_s: float = 0.15) -> float:
    """bf16 time / float32 time of a target-shaped linear (`rows` tokens, H -> I) on this CPU.

    Cached per machine, torch version and shape; one measurement costs well under a second.
    `DRAFTSMITH_BF16_PROBE` answers in its place when set (`forced_probe`).
    """
    forced = forced_probe()
    if forced is not None:
        return forced
    key = f"{machine_key()}|{rows}x{hidden_size}x{intermediate_size}"
    path = _probe_path()
    cached = read_json_dict(path)
    if isinstance(cached.get(key), (int, float)):
        return float(cached[key])
    fp32 = _time_matmul(torch.float32, rows, hidden_size, intermediate_size, budget_s)
    bf16 = _time_matmul(torch.bfloat16, rows, hidden_size, intermediate_size, budget_s)
    ratio = bf16 / max(fp32, 1e-9)
    cached[key] = ratio
    with contextlib.suppress(OSError):  # a read-only cache only costs the probe again next time
        write_json(path, cached, indent=1)
    return ratio


def check_dtype(value, key: str = "--dtype") -> None:
    """The one check of a compute dtype setting (`auto`, `float32`, `bfloat16`, `float16`).

    Args:
        value: the setting as given.
        key: how the message names the setting: a flag (`--dtype 'fp8' is not supported; ...`)
            or a file's key (`target.dtype = 'fp8': ...`).

    Raises:
        DraftsmithError: an unknown name, listing the choices.
    """
    if value in COMPUTE_DTYPES:
        return
    choices = ", ".join(COMPUTE_DTYPES)
    if key.startswith("--"):
        raise DraftsmithError(f"{key} {value!r} is not supported; choose one of: {choices}")
    raise DraftsmithError(f"{key} = {value!r}: choose one of: {choices}")


def _speed_words(ratio: float) -> str:
    return f"{ratio:.0f}x slower" if ratio >= 1.95 else (
        f"{ratio:.2f}x the time of float32" if ratio >= 1 else f"{1 / ratio:.1f}x faster")


_warned: set[str] = set()


def choose_dtype(requested: str, device: str | torch.device = "cpu", hidden_size: int = 1024,
                 intermediate_size: int | None = None) -> DtypeChoice:
    """Resolve a requested compute dtype (`auto` or an explicit name) for this device.

    Args:
        requested: `auto`, `float32`, `bfloat16` or `float16`.
        device: where the model runs.
        hidden_size, intermediate_size: the target's shapes, for the CPU probe.

    Raises:
        DraftsmithError: an unknown dtype name (lists the choices).
    """
    check_dtype(requested)
    device = torch.device(device)
    inter = intermediate_size or 4 * hidden_size
    if device.type == "cuda":
        if requested != "auto":
            return DtypeChoice(requested, "as requested")
        if torch.cuda.is_bf16_supported():
            return DtypeChoice("bfloat16", f"{torch.cuda.get_device_name(device)} supports bfloat16")
        return DtypeChoice("float16", f"{torch.cuda.get_device_name(device)} has no bfloat16")
    if device.type != "cpu" or requested in ("float32", "float16"):
        return DtypeChoice("float32" if requested == "auto" else requested, "as requested"
                           if requested != "auto" else f"{device.type}: float32")
    info = cpu_info()
    ratio = measure_bf16_slowdown(hidden_size, inter)
    if requested == "auto" and forced_probe() is not None:
        chosen = "bfloat16" if ratio < BF16_MARGIN else "float32"
        return DtypeChoice(chosen, f"{PROBE_ENV}={os.environ[PROBE_ENV].strip()} stands in for "
                           "this CPU's bf16 probe", ratio)
    if requested == "bfloat16":
        if ratio > 1 / BF16_MARGIN and "bf16" not in _warned:
            _warned.add("bf16")
            native = "has native bfloat16" if info.native_bf16 else "has no native bfloat16"
            print(f"warning: bfloat16 requested, but this CPU {native} and a bf16 matmul measured "
                  f"{_speed_words(ratio)} than float32 here; `auto` would pick float32",
                  file=sys.stderr)
        return DtypeChoice("bfloat16", "as requested", ratio)
    if not info.native_bf16:
        return DtypeChoice("float32", f"this CPU has no native bfloat16: bf16 matmul measured "
                           f"{_speed_words(ratio)}", ratio)
    if ratio < BF16_MARGIN:
        return DtypeChoice("bfloat16", f"native bfloat16: bf16 matmul measured "
                           f"{_speed_words(ratio)} than float32", ratio)
    return DtypeChoice("float32", f"native bfloat16, but bf16 matmul measured {_speed_words(ratio)}"
                       f" than float32 for these shapes", ratio)


def choose_mixed_precision(requested: str, device: str | torch.device = "cpu",
                           hidden_size: int = 1024) -> tuple[str, str]:
    """Resolve `train.mixed_precision` (`auto`, `no`, `bf16`, `fp16`): (setting, reason)."""
    if requested not in MIXED_PRECISIONS:
        raise DraftsmithError(f"train.mixed_precision={requested!r}: use one of "
                              f"{', '.join(MIXED_PRECISIONS)}")
    if requested != "auto":
        return requested, "as requested"
    choice = choose_dtype("auto", device, hidden_size)
    return choice.mixed_precision, choice.reason


def hardware_record(device: str | torch.device = "cpu", choice: DtypeChoice | None = None) -> dict:
    """What every measurement is stamped with: CPU model and ISA, threads, torch, device, dtype."""
    device = torch.device(device)
    info = cpu_info()
    record = {
        "cpu": info.model,
        "isa": info.isa,
        "native_bf16": info.native_bf16,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name(device)
    if choice is not None:
        record.update(dtype=choice.dtype, dtype_reason=choice.reason)
        if choice.bf16_slowdown is not None:
            record["bf16_slowdown"] = round(choice.bf16_slowdown, 2)
    return record


def describe_hardware(record: dict) -> str:
    """One line for report headers: `AMD EPYC (avx2, fma; no native bf16), 2 threads, float32`."""
    isa = ", ".join(record.get("isa") or []) or "ISA unknown"
    bf16 = "native bf16" if record.get("native_bf16") else "no native bf16"
    where = record.get("gpu") or record.get("cpu", "?")
    dtype = f", {record['dtype']}" if record.get("dtype") else ""
    return f"{where} ({isa}; {bf16}), {record.get('threads', '?')} threads{dtype}"
