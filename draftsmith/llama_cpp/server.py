"""llama.cpp's server, set up and started by draftsmith: the engine in its own environment under
the draftsmith cache, a context manager that serves a GGUF target on a free loopback port, and
greedy completions of token ids from it.

The engine is llama.cpp's native C++ server from the `xllamacpp` wheel on PyPI (prebuilt for CPU
x86/ARM, so nothing compiles here), installed once into `<cache>/engines/xllamacpp-<version>/`
with its own Python environment, never into the project's. `LlamaCppServer` starts
`launch.py` there, waits until `/health` answers, and stops it when the block ends,
also on Ctrl-C and on errors. Its log goes to a file whose tail is quoted when it fails. Given a
`DraftOptions`, the server decodes speculatively with a draft GGUF (e.g. an EAGLE-3 drafter from
`draftsmith export --format gguf`) and can serve its Prometheus `/metrics` (spec-decode counters).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from draftsmith.engines.engine_env import (
    engine_environment,
    engine_info,
    engines_dir,
    gpu_environment,
)
from draftsmith.engines.engine_requests import EngineAnswer
from draftsmith.engines.server_process import ServerProcess, free_port
from draftsmith.errors import DraftsmithError

ALL_LAYERS = 999  # llama.cpp's `-ngl 999`: every layer that fits offloaded (more than any model has)
XLLAMACPP_VERSION = "2026.10.11549"  # llama.cpp build 11549 (EAGLE-3 drafts, continuous batching)
LAUNCHER = Path(__file__).with_name("launch.py")
ENGINE = f"xllamacpp-{XLLAMACPP_VERSION}"


def engine_dir() -> Path:
    return engines_dir() / ENGINE


def engine_python(log: Callable[[str], None] = print) -> Path:
    """The engine environment's Python, installed on first use (about 35 MB from PyPI).

    `$DRAFTSMITH_LLAMA_CPP_PYTHON` names another Python that has `xllamacpp` (e.g. one built from
    source with this CPU's native instructions); it is checked, then used as is.

    Raises:
        DraftsmithError: the install failed (the pip output's tail is quoted), or
            `$DRAFTSMITH_LLAMA_CPP_PYTHON` names no Python with xllamacpp.
    """
    return engine_environment(ENGINE, ["--no-deps", f"xllamacpp=={XLLAMACPP_VERSION}"],
                              "llama.cpp", record={"xllamacpp": XLLAMACPP_VERSION}, log=log)


@dataclass(frozen=True)
class DraftOptions:
    """Speculative decoding in llama.cpp's server.

    Attributes:
        gguf: the draft model file.
        spec_type: llama-server's `--spec-type` (`draft-eagle3`, `draft-simple`, `draft-mtp` ...).
        draft_max: draft tokens per step at most (`--spec-draft-n-max`).
        draft_min: draft tokens per step at least.
        p_min: drafting stops at a draft token less likely than this; 0 always drafts draft_max.
    """

    gguf: Path
    spec_type: str = "draft-eagle3"
    draft_max: int = 3
    draft_min: int = 0
    p_min: float = 0.0

    def flags(self) -> list[str]:
        return ["--draft-model", str(self.gguf), "--spec-type", self.spec_type,
                "--draft-max", str(self.draft_max), "--draft-min", str(self.draft_min),
                "--draft-p-min", str(self.p_min)]


class LlamaCppServer(ServerProcess):
    """`with LlamaCppServer(gguf) as server:` serves `gguf` at `server.base_url` (OpenAI API).

    Args:
        gguf: the model file (verified by the caller).
        parallel: slots, i.e. requests decoded together (continuous batching).
        ctx_per_slot: context tokens per slot (prompt + answer).
        threads: CPU threads (default: every core this process may use).
        alias: the model name the server answers to (default: the file name).
        log_path: where the server's output goes (default: beside the engine).
        startup_timeout: seconds to wait for `/health`.
        draft: decode speculatively with this draft (None: plain decoding).
        metrics: serve Prometheus `/metrics` at `server.root_url`.
        device: `cpu` (no layer on a GPU: `--n-gpu-layers 0`) or `cuda` / `cuda:N` (every layer
            of the target and the draft on the GPU: `--n-gpu-layers 999`, llama-server's `-ngl`;
            needs a CUDA build of the engine, see `engine_env.require_gpu_engine`).
    """

    name = "llama.cpp's server"

    def __init__(self, gguf: str | Path, *, parallel: int = 16, ctx_per_slot: int = 2048,
                 threads: int | None = None, alias: str | None = None,
                 log_path: str | Path | None = None, startup_timeout: float = 180.0,
                 log: Callable[[str], None] = print, draft: DraftOptions | None = None,
                 metrics: bool = False, device: str = "cpu"):
        self.gguf = Path(gguf)
        self.device = device
        self.parallel, self.ctx_per_slot = parallel, ctx_per_slot
        self.threads = threads or len(os.sched_getaffinity(0))
        self.alias = alias or self.gguf.name
        self.log_path = Path(log_path) if log_path else engine_dir() / "server.log"
        self.startup_timeout = startup_timeout
        self.log = log
        self.draft, self.metrics = draft, metrics

    def loading(self) -> str:
        return f"{self.gguf} and {self.draft.gguf}" if self.draft else f"{self.gguf}"

    def command(self, python: Path) -> list[str]:
        """The launcher's command line (`self.port` set)."""
        gpu_layers = ALL_LAYERS if self.device.startswith("cuda") else 0
        command = [str(python), str(LAUNCHER), "--model", str(self.gguf), "--port", str(self.port),
                   "--parallel", str(self.parallel), "--ctx-per-slot", str(self.ctx_per_slot),
                   "--threads", str(self.threads), "--alias", self.alias,
                   "--n-gpu-layers", str(gpu_layers)]
        if self.draft:
            command += self.draft.flags()
        if self.metrics:
            command.append("--metrics")
        return command

    def __enter__(self) -> LlamaCppServer:
        if not self.gguf.is_file():
            raise DraftsmithError(f"{self.gguf} does not exist; llama.cpp's server needs the "
                                  "target's .gguf file (`draftsmith models fetch NAME`)")
        if self.draft and not self.draft.gguf.is_file():
            raise DraftsmithError(f"draft model {self.draft.gguf} does not exist")
        python = engine_python(self.log)
        self.port = free_port()
        command = self.command(python)
        self.launch(command, {**os.environ, **gpu_environment(self.device)})
        drafting = (f", {self.draft.spec_type} draft {self.draft.gguf.name} x "
                    f"{self.draft.draft_max}" if self.draft else "")
        self.log(f"llama.cpp server on {self.base_url}: {self.gguf.name}{drafting}, {self.parallel} "
                 f"slots x {self.ctx_per_slot} tokens, {self.threads} threads, {self.device} "
                 f"(log: {self.log_path})")
        return self


def complete_greedy(root_url: str, prompt_ids: list[int], max_new_tokens: int,
                    timeout: float = 600.0) -> EngineAnswer:
    """Greedy decoding of `prompt_ids` by llama.cpp's `/completion`, which takes the prompt as
    token ids (so the engine and draftsmith's loop decode exactly the same context) and answers
    with the new ids and `timings` (`predicted_ms`, and with a draft `draft_n` /
    `draft_n_accepted`); no prompt cache, so every request prefills the same way.

    Raises:
        DraftsmithError: the server refused the request or answered without tokens.
    """
    body = {"prompt": prompt_ids, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
            "return_tokens": True, "cache_prompt": False}
    try:
        response = httpx.post(f"{root_url}/completion", json=body, timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError as err:
        raise DraftsmithError(f"llama.cpp's server at {root_url} failed a completion: {err}") from err
    answer = response.json()
    if "tokens" not in answer or "timings" not in answer:
        raise DraftsmithError(f"llama.cpp's server answered without tokens or timings: "
                              f"{sorted(answer)}")
    timings = answer["timings"]
    return EngineAnswer(tokens=list(answer["tokens"]), predicted_ms=float(timings["predicted_ms"]),
                        draft_n=int(timings.get("draft_n", 0)),
                        draft_accepted=int(timings.get("draft_n_accepted", 0)))


def engine_record() -> dict:
    """What served the answers, for manifests and reports."""
    info = engine_info(ENGINE)
    return {"engine": "llama.cpp (xllamacpp)", "version": info.get("xllamacpp", XLLAMACPP_VERSION)}
