"""Where a target spec points: an offline model, a .gguf file, a local folder or a Hub id (probed,
with the cache as fallback), and whether a local folder has the tokenizer and safetensors weights
draftsmith loads."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.target import offline_models

HUB_PROBE_TIMEOUT_S = 5.0
TARGET_FORMS = ("an offline model name (`draftsmith models list`), a .gguf file, a transformers "
                "folder holding config.json, or a Hugging Face Hub id ORG/NAME")


def hub_endpoint() -> str:
    """The Hub URL huggingface_hub talks to (`$HF_ENDPOINT`, else huggingface.co)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    """True when `HF_HUB_OFFLINE` asks huggingface_hub to use only its cache."""
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")


def hub_probe_failure(api_path: str = "/api/models") -> str | None:
    """None when the Hub endpoint answers an HTTP request for `api_path` (any status) within
    `$HF_HUB_ETAG_TIMEOUT` seconds (default 5), else why not, e.g. `no answer within 5 s; ...`.

    huggingface_hub waits without a time limit for a server that accepts the connection and never
    answers (and retries some requests for half a minute); this one request fails in seconds.
    """
    try:
        timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or HUB_PROBE_TIMEOUT_S)
    except ValueError:
        timeout = HUB_PROBE_TIMEOUT_S
    return _probe(hub_endpoint() + api_path, timeout)


@functools.lru_cache(maxsize=64)
def _probe(url: str, timeout: float) -> str | None:
    """`hub_probe_failure` for one URL, asked once per process (a silent Hub costs its wait once)."""
    import httpx

    try:
        httpx.get(url, timeout=timeout)
    except httpx.TimeoutException:
        return f"no answer within {timeout:g} s; set HF_HUB_ETAG_TIMEOUT=SECONDS to wait longer"
    except httpx.HTTPError as err:
        return f"no connection: {type(err).__name__}"
    except (httpx.InvalidURL, ValueError):
        return "not a valid URL; check HF_ENDPOINT"
    return None


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def is_hub_id(spec: str) -> bool:
    """True when `spec` is a valid Hub repo id (`NAME` or `ORG/NAME`, huggingface_hub's rules)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        return False
    return True


def resolve_source(spec: str) -> tuple[str, dict]:
    """Turn a target spec into `(pretrained_name_or_path, extra from_pretrained kwargs)`.

    A Hub id is checked first with one bounded request (`hub_probe_failure`); without an answer
    it loads from the local Hugging Face cache, or fails at once.

    Raises:
        DraftsmithError: missing offline model, a missing path, a file that is not a .gguf, or a
            Hub id whose Hub does not answer and that is not in the local Hugging Face cache (the
            message names the endpoint and suggests the offline path).
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
    if path.exists():
        raise DraftsmithError(
            f"target {spec} exists but is a file that is neither a transformers folder, a .gguf "
            f"file, an offline model name nor a Hub id; the target is {TARGET_FORMS}")
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise DraftsmithError(f"target path {spec} does not exist; the target is {TARGET_FORMS}")
    if not is_hub_id(spec):
        raise DraftsmithError(
            f"target {spec!r} is not a file or folder here, an offline model name nor a valid Hub "
            f"id; the target is {TARGET_FORMS}")
    failure = "HF_HUB_OFFLINE is set" if hub_offline() else hub_probe_failure(
        f"/api/models/{spec}")
    if failure is not None:
        if _hub_cached(spec):
            return spec, {"local_files_only": True}
        offline = ", ".join(offline_models.CATALOG)
        raise DraftsmithError(
            f"cannot load {spec!r}: the Hugging Face Hub at {hub_endpoint()} is unreachable "
            f"({failure}) and the model is not in the local cache. Without a network use an "
            f"offline model (`draftsmith models fetch NAME`, NAME one of: {offline}) and pass its "
            "name as the target, or pass a local folder or .gguf file."
        )
    return spec, {}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DOWNLOAD = "huggingface-cli download ORG/NAME --local-dir DIR"


def missing_tokenizer(folder: Path) -> str | None:
    """Why a local target folder has no tokenizer to load (None when it has its files)."""
    if any((folder / name).is_file() for name in TOKENIZER_FILES) or any(folder.glob("*.tiktoken")):
        return None
    return (f"{folder} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES)}, "
            "*.tiktoken); copy them from the model's repository into it, or download the whole "
            f"model (`{DOWNLOAD}`) and pass DIR")


def weights_problem(folder: Path) -> str | None:
    """Why a local target folder's weights cannot load: none at all (a config-only folder), or
    only pickles (`pytorch_model.bin`), which can run code when loaded; None with safetensors."""
    if any(folder.glob("*.safetensors")):
        return None
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if not pickles:
        also = " and no tokenizer files" if missing_tokenizer(folder) else ""
        return (f"{folder} holds no weights (no *.safetensors){also}: it is not a whole "
                f"transformers folder; download the model (`{DOWNLOAD}`) and pass DIR")
    return (f"{folder} holds its weights only as a pickle ({', '.join(pickles[:3])}), which can "
            "run code when loaded; draftsmith loads safetensors only. Convert it once, where you "
            "trust the file: `python -c \"from transformers import AutoModelForCausalLM as M; "
            f"M.from_pretrained('{folder}').save_pretrained('{folder}-safetensors')\"` (then copy "
            "the tokenizer files over) and pass the new folder, or download the model's "
            f"safetensors (`{DOWNLOAD}`)")
