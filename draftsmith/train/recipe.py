"""Training recipes: YAML files parsed into validated dataclasses, with `section.key=value` overrides.

A recipe names the target, the drafter kind and its settings, the data and the optimisation
hyper-parameters. Unknown keys are an error that names the key and lists the valid ones; the
recipe is validated before any model is loaded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from draftsmith.data.config import apply_overrides, read_yaml_mapping
from draftsmith.errors import DraftsmithError
from draftsmith.registry import get_spec


@dataclass
class TargetSection:
    """The frozen target.

    Attributes:
        name: offline model name, local folder, .gguf file or Hub id.
        dtype: dtype the target runs in (bfloat16 on GPUs and for speed; float32 for exactness).
        trust_remote_code: run model code from the Hub repo (off unless asked).
    """

    name: str = "smollm2-135m-instruct"
    dtype: str = "bfloat16"
    trust_remote_code: bool = False


@dataclass
class TrainSection:
    """Optimisation and bookkeeping.

    Attributes:
        lr: peak learning rate (AdamW betas 0.9, 0.95).
        weight_decay: AdamW weight decay.
        batch_size: sequences per process per micro-step.
        grad_accum: micro-steps per optimizer step.
        max_steps: optimizer steps in total.
        warmup_steps: linear warmup before the cosine decay.
        max_length: tokens per sequence (longer ones are truncated).
        clip: gradient norm clip (0 disables).
        mixed_precision: "no", "bf16" or "fp16" (accelerate autocast).
        save_every: optimizer steps between resumable checkpoints (0 = only at the end).
        eval_every: optimizer steps between held-out evaluations (0 = only at the end).
        eval_fraction: share of the data held out for accuracy / simulated acceptance.
        seed: seed for data order, init and noise.
        output_dir: checkpoints, metrics.jsonl and the final drafter go here.
        wandb: log to Weights & Biases (offline mode when no API key is set).
        wandb_project: project name for wandb.
        features: "online" (the frozen target runs inside each step) or "offline" (hidden states
            read from the data pipeline's cache; needs `data.cache` with this drafter kind).
    """

    lr: float = 1e-4
    weight_decay: float = 0.0
    batch_size: int = 4
    grad_accum: int = 1
    max_steps: int = 200
    warmup_steps: int = 20
    max_length: int = 512
    clip: float = 0.5
    mixed_precision: str = "no"
    save_every: int = 0
    eval_every: int = 0
    eval_fraction: float = 0.05
    seed: int = 0
    output_dir: str = "runs/train"
    wandb: bool = False
    wandb_project: str = "draftsmith"
    features: str = "online"

    def __post_init__(self):
        positive = ("lr", "batch_size", "grad_accum", "max_steps", "max_length")
        for name in positive:
            if getattr(self, name) <= 0:
                raise DraftsmithError(f"train.{name}={getattr(self, name)} must be > 0")
        if self.features not in ("online", "offline"):
            raise DraftsmithError(f"train.features={self.features!r}: use online or offline")
        if self.mixed_precision not in ("no", "bf16", "fp16"):
            raise DraftsmithError(f"train.mixed_precision={self.mixed_precision!r}: use no, bf16 or fp16")
        if not 0 <= self.eval_fraction < 1:
            raise DraftsmithError(f"train.eval_fraction={self.eval_fraction} must be in [0, 1)")
        if self.warmup_steps < 0 or self.warmup_steps > self.max_steps:
            raise DraftsmithError(f"train.warmup_steps={self.warmup_steps} must be in "
                                  f"[0, max_steps={self.max_steps}]")


@dataclass
class Recipe:
    """A whole recipe. `drafter` holds `kind` plus that kind's config fields; `data` is passed to
    the data pipeline."""

    target: TargetSection = field(default_factory=TargetSection)
    drafter: dict = field(default_factory=lambda: {"kind": "eagle3"})
    data: dict = field(default_factory=dict)
    train: TrainSection = field(default_factory=TrainSection)

    @property
    def kind(self) -> str:
        return self.drafter.get("kind", "")

    def drafter_config(self):
        """The kind's config dataclass built (and validated) from the `drafter:` section."""
        spec = get_spec(self.kind)
        return spec.make_config({k: v for k, v in self.drafter.items() if k != "kind"})

    def to_dict(self) -> dict:
        return asdict(self)


SECTIONS = {"target": TargetSection, "train": TrainSection}


def _check_keys(section: str, values: dict, cls) -> dict:
    """Reject unknown keys; coerce numbers written as strings (YAML reads `1e-4` as a string)."""
    types = {f.name: f.type for f in fields(cls)}
    unknown = sorted(set(values) - set(types))
    if unknown:
        raise DraftsmithError(f"unknown key(s) {unknown} in recipe section {section!r}; "
                              f"valid: {sorted(types)}")
    coerced = dict(values)
    for key, value in values.items():
        if types[key] in ("float", float) and isinstance(value, (str, int)):
            try:
                coerced[key] = float(value)
            except ValueError as err:
                raise DraftsmithError(f"{section}.{key}={value!r} is not a number") from err
    return coerced


def build_recipe(raw: dict) -> Recipe:
    """Validate a raw mapping (from YAML) into a Recipe."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - {"target", "drafter", "data", "train"})
    if unknown:
        raise DraftsmithError(f"unknown recipe section(s) {unknown}; valid: data, drafter, "
                              "target, train")
    built = {}
    for name, cls in SECTIONS.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise DraftsmithError(f"recipe section {name!r} must be a mapping, got {values!r}")
        values = _check_keys(name, values, cls)
        try:
            built[name] = cls(**values)
        except TypeError as err:
            raise DraftsmithError(f"recipe section {name!r}: {err}") from err
    drafter = dict(raw.get("drafter") or {})
    if "kind" not in drafter:
        raise DraftsmithError("recipe section 'drafter' needs a 'kind' (see draftsmith/registry.py)")
    recipe = Recipe(target=built["target"], drafter=drafter, data=dict(raw.get("data") or {}),
                    train=built["train"])
    recipe.drafter_config()  # validates kind and settings now, before any model is loaded
    return recipe


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, override and validate a recipe file."""
    raw = read_yaml_mapping(path, "recipe", "recipes live in recipes/")
    return build_recipe(apply_overrides(raw, overrides or []))
