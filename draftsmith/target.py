"""Load a frozen target model and its tokenizer from an offline name, a folder, a GGUF file or a Hub id.

`spec` forms, tried in this order:
  * a name from the offline catalog (`smollm2-135m-instruct`), fetched by `draftsmith models fetch`;
  * a path to a `.gguf` file (dequantized by transformers' gguf support);
  * a local transformers folder (holding `config.json`);
  * a Hugging Face Hub id (`Qwen/Qwen2.5-Coder-1.5B-Instruct`), which needs the network or the
    Hugging Face cache.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch

from draftsmith import offline_models
from draftsmith.errors import DraftsmithError
from draftsmith.precision import DtypeChoice, choose_dtype

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)


@dataclass
class Target:
    """A loaded, frozen target: the model (eval mode, no grads) and its tokenizer."""

    model: torch.nn.Module
    tokenizer: object
    spec: str
    dtype_choice: DtypeChoice | None = None

    @property
    def eos_token_ids(self) -> list[int]:
        """Every token id that ends generation (generation config and tokenizer, deduplicated)."""
        ids: list[int] = []
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.extend([eos] if isinstance(eos, int) else list(eos or []))
        tok_eos = getattr(self.tokenizer, "eos_token_id", None)
        if tok_eos is not None:
            ids.append(tok_eos)
        return list(dict.fromkeys(ids))


def resolve_dtype(name: str) -> torch.dtype:
    """Map an explicit dtype name to torch (`auto` is resolved by `choose_target_dtype`).

    Raises:
        DraftsmithError: unknown name (lists the choices).
    """
    if name not in DTYPES:
        raise DraftsmithError(f"--dtype {name!r} is not supported; choose one of: "
                              f"{', '.join(DTYPE_CHOICES)}")
    return DTYPES[name]


_announced: set[tuple[str, str]] = set()


def choose_target_dtype(spec: str, dtype: str, device: str = "cpu", *,
                        trust_remote_code: bool = False) -> DtypeChoice:
    """Resolve `dtype` (`auto` or explicit) for this target on this device, and say it once.

    `auto` probes the target's own matmul shapes (read from its config, no weights loaded).

    Raises:
        DraftsmithError: unknown dtype or device, or an unloadable target config.
    """
    return _choose_dtype(spec, resolve_source(spec), dtype, device, trust_remote_code)


def _choose_dtype(spec: str, source: tuple[str, dict], dtype: str, device: str,
                  trust_remote_code: bool) -> DtypeChoice:
    if dtype not in DTYPE_CHOICES:
        raise DraftsmithError(f"--dtype {dtype!r} is not supported; choose one of: "
                              f"{', '.join(DTYPE_CHOICES)}")
    torch_device = resolve_device(device)
    hidden, inter = 1024, None
    if dtype in ("auto", "bfloat16") and torch_device.type == "cpu":
        from transformers import AutoConfig

        name, kwargs = source
        try:
            config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code,
                                                **kwargs)
        except (OSError, ValueError) as err:
            raise DraftsmithError(f"could not read the config of target {spec!r}: {err}") from err
        config = getattr(config, "text_config", None) or config
        hidden = getattr(config, "hidden_size", hidden)
        inter = getattr(config, "intermediate_size", None)
    choice = choose_dtype(dtype, torch_device, hidden, inter)
    if dtype == "auto" and (spec, choice.dtype) not in _announced:
        _announced.add((spec, choice.dtype))
        print(f"dtype: {choice.dtype} ({choice.reason})", file=sys.stderr)
    return choice


def resolve_device(name: str) -> torch.device:
    """Validate a device string (`cpu`, `cuda`, `cuda:1`, or `auto` = cuda when available).

    Raises:
        DraftsmithError: CUDA requested where there is none, or a malformed name.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise DraftsmithError(f"--device {name!r} is not a device; use cpu, cuda, cuda:N or auto") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DraftsmithError(f"--device {name!r} asked for CUDA but no GPU is visible; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise DraftsmithError(f"--device {name!r} is not supported; use cpu, cuda, cuda:N or auto")
    return device


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """True when the Hub endpoint (`$HF_ENDPOINT`) accepts a TCP connection within `timeout_s`."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def resolve_source(spec: str) -> tuple[str, dict]:
    """Turn a target spec into `(pretrained_name_or_path, extra from_pretrained kwargs)`.

    Raises:
        DraftsmithError: missing offline model, missing path, or an unreachable Hub id that is
            not in the local Hugging Face cache (the message suggests the offline path).
    """
    offline_models.verify_local_files(spec)
    if spec in offline_models.CATALOG:
        if not offline_models.is_fetched(spec):
            raise DraftsmithError(
                f"offline model {spec!r} is not fetched yet; run `draftsmith models fetch {spec}`"
            )
        return str(offline_models.model_dir(spec)), {}
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise DraftsmithError(f"GGUF file {path} does not exist")
        return str(path.parent), {"gguf_file": path.name}
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise DraftsmithError(f"{path} is a folder without config.json: not a transformers model")
        return str(path), {}
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise DraftsmithError(f"target path {spec} does not exist")
    if not hub_reachable():
        if _hub_cached(spec):
            return spec, {"local_files_only": True}
        offline = ", ".join(offline_models.CATALOG)
        raise DraftsmithError(
            f"cannot load {spec!r}: the Hugging Face Hub is unreachable and the model is not in the "
            f"local cache. Without a network use an offline model (`draftsmith models fetch NAME`, "
            f"NAME one of: {offline}) and pass its name as the target, or pass a local folder or "
            f".gguf file."
        )
    return spec, {}


def load_tokenizer(spec: str, *, trust_remote_code: bool = False):
    """Load only the tokenizer of a target spec (same resolution as `load_target`)."""
    from transformers import AutoTokenizer

    source, kwargs = resolve_source(spec)
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as err:
        raise DraftsmithError(f"could not load the tokenizer of {spec!r}: {err}") from err


def load_target(
    spec: str,
    *,
    dtype: str = "auto",
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> Target:
    """Load a causal LM target frozen in eval mode, with its tokenizer.

    Args:
        spec: offline name, `.gguf` path, local folder or Hub id (see the module docstring).
        dtype: `auto` (measured: see `draftsmith.precision`), `float32`, `bfloat16` or `float16`.
        device: `cpu`, `cuda`, `cuda:N` or `auto`.
        trust_remote_code: run model code shipped with a Hub repo; off unless asked.

    Raises:
        DraftsmithError: for any user-fixable problem (bad dtype/device/path, no network).
    """
    from transformers import AutoModelForCausalLM

    torch_device = resolve_device(device)
    source, kwargs = resolve_source(spec)
    choice = _choose_dtype(spec, (source, kwargs), dtype, device, trust_remote_code)
    torch_dtype = resolve_dtype(choice.dtype)
    tokenizer = load_tokenizer(spec, trust_remote_code=trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, trust_remote_code=trust_remote_code, **kwargs
        )
    except (OSError, ValueError) as err:
        raise DraftsmithError(f"could not load target {spec!r}: {err}") from err
    model.to(torch_device).eval().requires_grad_(False)
    return Target(model=model, tokenizer=tokenizer, spec=spec, dtype_choice=choice)
