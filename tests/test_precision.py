"""dtype `auto`: chosen from the CPU's flags and a measured probe (faked here), explicit wins."""

import pytest
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.target import precision
from draftsmith.target.precision import (
    CpuInfo,
    choose_dtype,
    choose_mixed_precision,
    hardware_record,
)

AVX2 = CpuInfo("AMD EPYC", frozenset({"avx2", "fma"}))
SAPPHIRE = CpuInfo("Intel Xeon Platinum 8480", frozenset({"avx2", "avx512f", "avx512_bf16",
                                                          "amx_bf16", "amx_tile"}))


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """Fake the CPU and the probe's bf16/fp32 ratio; the cache points at a temporary folder."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    monkeypatch.delenv(precision.PROBE_ENV, raising=False)

    def fake(info: CpuInfo, ratio: float):
        monkeypatch.setattr(precision, "cpu_info", lambda: info)
        monkeypatch.setattr(precision, "_time_matmul",
                            lambda dtype, *a, **k: ratio if dtype == torch.bfloat16 else 1.0)
    return fake


def test_no_native_bf16_picks_float32_and_says_why(machine):
    machine(AVX2, 48.0)
    choice = choose_dtype("auto", "cpu", 576, 1536)
    assert choice.dtype == "float32" and choice.mixed_precision == "no"
    assert choice.reason == "this CPU has no native bfloat16: bf16 matmul measured 48x slower"


def test_native_bf16_that_measures_faster_picks_bf16(machine):
    machine(SAPPHIRE, 0.4)
    choice = choose_dtype("auto", "cpu", 576, 1536)
    assert choice.dtype == "bfloat16" and choice.mixed_precision == "bf16"
    assert "2.5x faster" in choice.reason


def test_native_bf16_that_measures_slower_keeps_float32(machine):
    machine(SAPPHIRE, 1.3)
    assert choose_dtype("auto", "cpu", 64, 128).dtype == "float32"


@pytest.mark.parametrize("forced, dtype", [("bf16", "bfloat16"), ("float32", "float32")])
@pytest.mark.parametrize("cpu", [AVX2, SAPPHIRE])
def test_forced_probe_gives_the_same_choice_on_every_cpu(machine, monkeypatch, forced, dtype, cpu):
    machine(cpu, 48.0 if cpu is AVX2 else 0.4)
    monkeypatch.setenv(precision.PROBE_ENV, forced)
    choice = choose_dtype("auto", "cpu", 576, 1536)
    assert choice.dtype == dtype
    assert choice.reason == f"DRAFTSMITH_BF16_PROBE={forced} stands in for this CPU's bf16 probe"
    assert choose_dtype("float32", "cpu").dtype == "float32"
    monkeypatch.setenv(precision.PROBE_ENV, "measure")
    assert choose_dtype("auto", "cpu", 576, 1536).dtype == ("float32" if cpu is AVX2 else "bfloat16")


def test_forced_probe_with_an_unknown_answer_names_the_choices(machine, monkeypatch):
    machine(AVX2, 48.0)
    monkeypatch.setenv(precision.PROBE_ENV, "fast")
    with pytest.raises(DraftsmithError, match="DRAFTSMITH_BF16_PROBE='fast': use one of bf16, "
                       "float32, measure"):
        choose_dtype("auto", "cpu", 576, 1536)


def test_explicit_dtype_wins_and_bf16_on_a_slow_cpu_warns_once(machine, capsys):
    machine(AVX2, 48.0)
    precision._warned.clear()
    assert choose_dtype("float32", "cpu").dtype == "float32"
    assert choose_dtype("bfloat16", "cpu").dtype == "bfloat16"
    assert choose_dtype("bfloat16", "cpu").dtype == "bfloat16"
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "no native bfloat16" in warnings[0] and "48x slower" in warnings[0]


def test_cuda_prefers_bf16_where_supported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100")
    assert choose_dtype("auto", "cuda").dtype == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert choose_dtype("auto", "cuda").dtype == "float16"
    assert choose_mixed_precision("auto", "cuda") == ("fp16", "NVIDIA H100 has no bfloat16")


def test_probe_is_cached_per_machine(machine, monkeypatch):
    machine(AVX2, 10.0)
    precision.measure_bf16_slowdown(64, 128)
    monkeypatch.setattr(precision, "_time_matmul", lambda *a, **k: pytest.fail("probed twice"))
    assert precision.measure_bf16_slowdown(64, 128) == 10.0


def test_unknown_names_list_the_choices():
    with pytest.raises(DraftsmithError, match="auto, float32, bfloat16, float16"):
        choose_dtype("fp8")
    with pytest.raises(DraftsmithError, match="auto, no, bf16, fp16"):
        choose_mixed_precision("yes")


def test_hardware_record_names_cpu_isa_and_dtype(machine):
    machine(AVX2, 48.0)
    record = hardware_record("cpu", choose_dtype("auto", "cpu", 64, 128))
    assert record["cpu"] == "AMD EPYC" and record["isa"] == ["avx2", "fma"]
    assert record["native_bf16"] is False and record["dtype"] == "float32"
    assert precision.describe_hardware(record).startswith("AMD EPYC (avx2, fma; no native bf16)")
