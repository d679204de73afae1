"""GPU options where a user expects them, checked without a GPU: `--device` parsed and passed by
serve-check and bench, vLLM's command line and environment for cuda vs cpu (llama.cpp's:
tests/llama_cpp/test_server.py), the refusal of a CPU engine build on a GPU, and what the float32
lossless gate sets and promises on a GPU."""

from __future__ import annotations

import pytest
import torch

from draftsmith.cli import main
from draftsmith.engines import vllm
from draftsmith.engines.engine_env import require_gpu_engine
from draftsmith.engines.vllm import VllmServer, _runtime_env
from draftsmith.errors import DraftsmithError
from draftsmith.serving import serve_check
from draftsmith.serving.serve_check import ServeCheckSettings


def test_vllm_on_a_gpu_runs_without_the_cpu_only_flags(tmp_path):
    cpu = VllmServer(tmp_path)
    gpu = VllmServer(tmp_path, device="cuda:1")
    cpu.port = gpu.port = 1234
    cpu_command, gpu_command = cpu.command(tmp_path / "py"), gpu.command(tmp_path / "py")
    assert "--enforce-eager" in cpu_command
    assert cpu_command[cpu_command.index("--max-num-seqs") + 1] == "1"
    assert "--enforce-eager" not in gpu_command and "--max-num-seqs" not in gpu_command
    assert [a for a in cpu_command if a not in ("--enforce-eager", "--max-num-seqs", "1")] == \
        gpu_command
    cpu_env = _runtime_env(tmp_path / "bin/python", 2, 4)
    gpu_env = _runtime_env(tmp_path / "bin/python", 2, 4, "cuda:1")
    assert cpu_env["VLLM_CPU_KVCACHE_SPACE"] == "2" and cpu_env["OMP_NUM_THREADS"] == "4"
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu_env and gpu_env["CUDA_VISIBLE_DEVICES"] == "1"


def test_a_gpu_needs_a_gpu_build_of_the_engine(monkeypatch):
    monkeypatch.delenv("DRAFTSMITH_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("DRAFTSMITH_LLAMA_CPP_PYTHON", raising=False)
    require_gpu_engine("vllm", "cpu")  # the CPU builds draftsmith installs serve the CPU
    with pytest.raises(DraftsmithError, match=r"\$DRAFTSMITH_VLLM_PYTHON.*--device cpu"):
        require_gpu_engine("vllm", "cuda")
    with pytest.raises(DraftsmithError, match=r"CUDA build of `xllamacpp`"):
        require_gpu_engine("llama.cpp", "cuda:0")


def test_serve_check_device_flag_is_parsed_and_checked(tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("Hello.\n")
    assert main(["serve-check", str(tmp_path), "--device", "cuda",
                 "--prompts", str(tmp_path / "prompts.txt")]) == 2
    assert "--device 'cuda' asked for CUDA but no GPU is visible" in capsys.readouterr().err
    assert ServeCheckSettings(device="auto").device == "cpu"  # resolved here: no GPU


class Reached(Exception):
    """Raised by a recorded engine instead of starting it."""


def recorder(seen: dict):
    class Server:
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)

        def __enter__(self):
            raise Reached

        def __exit__(self, *exc):
            return False

    return Server


def test_serve_check_passes_the_device_to_both_engines(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # only the name is checked
    settings = ServeCheckSettings(device="cuda:1")
    assert settings.device == "cuda:1"
    seen: dict = {}
    monkeypatch.setattr(serve_check, "LlamaCppServer", recorder(seen))
    with pytest.raises(Reached):
        serve_check.run_engine(tmp_path / "t.gguf", [[1, 2]], settings, tmp_path / "log")
    assert seen["device"] == "cuda:1"
    seen.clear()
    monkeypatch.setattr(vllm, "VllmServer", recorder(seen))
    with pytest.raises(Reached):
        serve_check.run_vllm(tmp_path, [[1, 2]], settings, tmp_path / "log")
    assert seen["device"] == "cuda:1"
