"""Load a frozen target model and its tokenizer from an offline name, a folder, a GGUF file or a Hub id.

`TargetSpec` is the one home of a target's settings (name, dtype, device, remote code), checked
when built; recipes, the eval and serve-check flags and the benchmark all make one.

`spec` forms, tried in this order:
  * a name from the offline catalog (`smollm2-135m-instruct`), fetched by `draftsmith models fetch`;
  * a path to a `.gguf` file (dequantized by transformers' gguf support);
  * a local transformers folder (holding `config.json`);
  * a Hugging Face Hub id (`Qwen/Qwen2.5-Coder-1.5B-Instruct`), which needs the network or the
    Hugging Face cache.
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
from dataclasses import InitVar, dataclass
from pathlib import Path

import torch

from draftsmith import offline_models
from draftsmith.errors import DraftsmithError
from draftsmith.offline_models import DEFAULT_TARGET
from draftsmith.precision import DtypeChoice, check_dtype, choose_dtype

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FLAGS = "--"  # `TargetSpec(where=FLAGS)`: errors name command-line flags


def setting_key(where: str, field: str) -> str:
    """How a message names a target field: `target.dtype` in a file's `target:` section
    (`where="target"`), `--dtype` on the command line (`where="--"`), `dtype` at a file's top
    level (`where=""`); the name is `--target` / `target` outside a section."""
    if where == FLAGS:
        return "--" + ("target" if field == "name" else field.replace("_", "-"))
    if not where:
        return "target" if field == "name" else field
    return f"{where}.{field}"


@dataclass
class TargetSpec:
    """The frozen target a command runs with, checked when built (before any model is loaded).

    The one home of these settings: a training recipe's and a data recipe's `target:` section,
    `draftsmith eval`'s and `serve-check`'s flags and a benchmark's `target:` / `dtype:` all make
    one.

    Attributes:
        name: offline model name, local folder, .gguf file or Hub id.
        dtype: dtype the target runs in: `auto` (bf16 on GPUs and on CPUs where a measured probe
            shows it faster, else float32), `float32`, `bfloat16` or `float16`.
        device: `cpu`, `cuda`, `cuda:N` or `auto`; None where the command places the target
            itself (training: each process's device, as accelerate chose it).
        trust_remote_code: run model code from the Hub repo (off unless asked).
        where: how errors name the fields (see `setting_key`); not a setting.
    """

    name: str = DEFAULT_TARGET
    dtype: str = "auto"
    device: str | None = "cpu"
    trust_remote_code: bool = False
    where: InitVar[str] = "target"

    def __post_init__(self, where: str):
        if not isinstance(self.name, str) or not self.name:
            raise DraftsmithError(f"{_named(where, 'name', self.name)}: name an offline model, a "
                                  "folder, a .gguf file or a Hub id")
        check_dtype(self.dtype, setting_key(where, "dtype"))
        if self.device is not None:
            if not isinstance(self.device, str) or not self.device:
                raise DraftsmithError(f"{_named(where, 'device', self.device)}: use cpu, cuda, "
                                      "cuda:N or auto")
            resolve_device(self.device, setting_key(where, "device"))
        if not isinstance(self.trust_remote_code, bool):
            raise DraftsmithError(f"{_named(where, 'trust_remote_code', self.trust_remote_code)}"
                                  ": must be true or false")

    def load(self, device: str | None = None) -> Target:
        """The target loaded frozen (`load_target`), on `device` (default: this spec's, else cpu)."""
        return load_target(self.name, dtype=self.dtype, device=device or self.device or "cpu",
                           trust_remote_code=self.trust_remote_code)


def _named(where: str, field: str, value) -> str:
    return _given(setting_key(where, field), value)


def _given(key: str, value) -> str:
    """`--device 'tpu'` or `target.device = 'tpu'`: a setting and its value, for messages."""
    return f"{key} {value!r}" if key.startswith("--") else f"{key} = {value!r}"


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
        DraftsmithError: unknown name (lists the choices), or `auto`.
    """
    check_dtype(name)
    if name not in DTYPES:
        raise DraftsmithError(f"dtype {name!r} is decided per machine; resolve it with "
                              "choose_target_dtype first")
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
    check_dtype(dtype)
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


def resolve_device(name: str, key: str = "--device") -> torch.device:
    """Validate a device string (`cpu`, `cuda`, `cuda:1`, or `auto` = cuda when available).

    Args:
        name: the device setting.
        key: how messages name it: a flag (`--device`) or a file's key (`target.device`).

    Raises:
        DraftsmithError: CUDA requested where there is none, or a malformed name.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    given = _given(key, name)
    use_cpu = f"{key} cpu" if key.startswith("--") else f"{key}=cpu"
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise DraftsmithError(f"{given} is not a device; use cpu, cuda, cuda:N or auto") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DraftsmithError(f"{given} asked for CUDA but no GPU is visible; use {use_cpu}")
    if device.type not in ("cpu", "cuda"):
        raise DraftsmithError(f"{given} is not supported; use cpu, cuda, cuda:N or auto")
    return device


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


def load_tokenizer(spec: str, *, trust_remote_code: bool = False):
    """Load only the tokenizer of a target spec (same resolution as `load_target`).

    Raises:
        DraftsmithError: no tokenizer (a local folder without its files: named), or one that
            does not load.
    """
    from transformers import AutoTokenizer

    source, kwargs = resolve_source(spec)
    if not kwargs and Path(source).is_dir() and (why := missing_tokenizer(Path(source))):
        raise DraftsmithError(f"cannot load the tokenizer of target {spec!r}: {why}")
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
    if not kwargs and Path(source).is_dir() and (why := weights_problem(Path(source))):
        raise DraftsmithError(f"cannot load target {spec!r}: {why}")
    choice = _choose_dtype(spec, (source, kwargs), dtype, device, trust_remote_code)
    torch_dtype = resolve_dtype(choice.dtype)
    tokenizer = load_tokenizer(spec, trust_remote_code=trust_remote_code)
    if torch_device.type == "cuda":  # weights go straight to the GPU, never whole in host RAM
        kwargs = {**kwargs, "device_map": torch_device}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, trust_remote_code=trust_remote_code, **kwargs
        )
    except (OSError, ValueError) as err:
        raise DraftsmithError(f"could not load target {spec!r}: {err}") from err
    except pickle.UnpicklingError as err:  # a Hub repo or cache whose weights are pickles
        raise DraftsmithError(
            f"could not load target {spec!r}: its weights are a pickle that torch refuses to load "
            f"({str(err).splitlines()[0]}); draftsmith loads safetensors only: download the "
            f"model's safetensors (`{DOWNLOAD}`) or convert it where you trust the file") from None
    model.to(torch_device).eval().requires_grad_(False)
    return Target(model=model, tokenizer=tokenizer, spec=spec, dtype_choice=choice)
