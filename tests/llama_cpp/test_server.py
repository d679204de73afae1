"""llama.cpp's server command line, checked without starting it: every layer on a GPU and none
on a CPU, and every flag it passes one its launcher (run by the engine's own Python) parses."""

from __future__ import annotations

import re
from pathlib import Path

from draftsmith.engines.engine_env import gpu_environment
from draftsmith.llama_cpp import server as llama_cpp
from draftsmith.llama_cpp.server import DraftOptions, LlamaCppServer


def test_llama_cpp_puts_every_layer_on_a_gpu_and_none_on_a_cpu(tmp_path):
    draft = DraftOptions(tmp_path / "draft.gguf")
    for device, layers in (("cpu", "0"), ("cuda", "999"), ("cuda:1", "999")):
        server = LlamaCppServer(tmp_path / "t.gguf", device=device, draft=draft, threads=2)
        server.port = 1234
        command = server.command(tmp_path / "python")
        assert command[command.index("--n-gpu-layers") + 1] == layers
        assert command[command.index("--draft-model") + 1] == str(tmp_path / "draft.gguf")
    assert gpu_environment("cuda:1") == {"CUDA_VISIBLE_DEVICES": "1"}
    assert gpu_environment("cuda") == {} and gpu_environment("cpu") == {}


def test_the_llama_cpp_launcher_declares_every_flag_the_server_passes(tmp_path):
    """The launcher runs in the engine's own Python (it imports xllamacpp), so its flags are
    read from its source: each flag of the command line is one it parses."""
    declared = set(re.findall(r'add_argument\("(--[a-z-]+)"', llama_cpp.LAUNCHER.read_text()))
    server = LlamaCppServer(tmp_path / "t.gguf", device="cuda", metrics=True, threads=2,
                            draft=DraftOptions(tmp_path / "d.gguf"))
    server.port = 1
    passed = {arg for arg in server.command(Path("python")) if arg.startswith("--")}
    assert passed <= declared, passed - declared
    assert "params.n_gpu_layers = args.n_gpu_layers" in llama_cpp.LAUNCHER.read_text()
    assert "spec.draft.n_gpu_layers = args.n_gpu_layers" in llama_cpp.LAUNCHER.read_text()
