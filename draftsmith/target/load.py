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

import pickle
import sys
from dataclasses import InitVar, dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.target.offline_models import DEFAULT_TARGET
from draftsmith.target.precision import DtypeChoice, check_dtype, choose_dtype
from draftsmith.target.source import DOWNLOAD, missing_tokenizer, resolve_source, weights_problem

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
        dtype: `auto` (measured: see `draftsmith.target.precision`), `float32`, `bfloat16` or `float16`.
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
