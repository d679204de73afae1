"""A recipe's memory plan end to end: read the recipe, size the models on the meta device, run
the memory model for the device, and write the report `draftsmith plan` prints."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.plan.gpus import GB, Device, parse_device
from draftsmith.plan.memory import (
    FITS_BELOW,
    Change,
    Plan,
    Settings,
    cache_bytes_per_token,
    changes_that_fit,
    default_attention,
    plan_memory,
    verdict,
)
from draftsmith.plan.shapes import ModelShapes, model_shapes

SHARDINGS = ("ddp", "fsdp")
TWO_BYTES = ("bfloat16", "float16", "bf16", "fp16")


@dataclass
class PlanReport:
    """Everything `draftsmith plan` prints."""

    recipe: str
    target: str
    device: Device
    shapes: ModelShapes
    plan: Plan
    accum: int
    changes: list[Change]
    data_tokens: int | None

    @property
    def verdict(self) -> str:
        return verdict(self.plan.peak, self.device.memory)


def recipe_settings(recipe, device: Device, processes: int, sharding: str | None) -> Settings:
    """The plan's settings from a recipe on `device` (dtype auto: bf16 on a GPU, float32 on a
    CPU; pass target.dtype=bfloat16 for a CPU with native bf16)."""
    train = recipe.train
    dtype = recipe.target.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.kind == "cuda" else "float32"
    target_bytes = 2 if dtype in TWO_BYTES else 4
    mixed = train.mixed_precision
    if mixed == "auto":
        mixed = "bf16" if target_bytes == 2 else "no"
    cache = recipe.data.get("cache") if isinstance(recipe.data.get("cache"), dict) else {}
    return Settings(
        batch=train.batch_size, length=train.max_length, target_bytes=target_bytes,
        act_bytes=2 if mixed in TWO_BYTES else 4, processes=processes,
        sharding=(sharding or "ddp") if processes > 1 else "none",
        online=train.features == "online", cache_bytes=_dtype_bytes(cache.get("dtype")),
        # issue 29's recipe option; read so that a plan written before it exists still runs
        checkpointing=bool(getattr(train, "gradient_checkpointing", False)),
        device=device.kind, attention=default_attention(device.kind),
        overlap=train.overlaps_target(device.kind, processes) and sharding != "fsdp")


def _dtype_bytes(name: str | None) -> float:
    """Bytes per cached value of a `data.cache.dtype` (bfloat16 when unset)."""
    dtype = getattr(torch, name or "bfloat16", None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else 2


def plan_recipe(path: str | Path, overrides: list[str] | None = None, gpu: str = "h100-80gb",
                gpus: int = 1, sharding: str | None = None,
                target_config: str | None = None) -> PlanReport:
    """The plan of a recipe on `gpus` devices named `gpu`.

    Raises:
        DraftsmithError: an unknown GPU or sharding, a recipe that does not validate, a target
            without a local config.
    """
    from draftsmith.train.recipe import load_recipe

    device = parse_device(gpu)
    if gpus < 1:
        raise DraftsmithError(f"--gpus {gpus}: use 1 or more (ranks on this node and others)")
    if sharding is not None and sharding not in SHARDINGS:
        raise DraftsmithError(f"--sharding {sharding!r}: use one of {', '.join(SHARDINGS)}")
    recipe = load_recipe(path, overrides)
    shapes = model_shapes(recipe, target_config)
    settings = recipe_settings(recipe, device, gpus, sharding)
    plan = plan_memory(shapes, settings)
    changes = [] if verdict(plan.peak, device.memory) == "fits" else changes_that_fit(
        shapes, settings, device.memory, recipe.train.grad_accum)
    return PlanReport(str(path), recipe.target.name, device, shapes, plan,
                      recipe.train.grad_accum, changes, _data_tokens(recipe))


def _data_tokens(recipe) -> int | None:
    """Tokens (at max length) of the recipe's rendered data when it is already prepared."""
    tokenized = recipe.data.get("tokenized") or (
        Path(recipe.data["out_dir"]) / "tokenized.jsonl" if recipe.data.get("out_dir") else None)
    if tokenized is None or not Path(tokenized).is_file():
        return None
    cap = recipe.train.max_length
    with open(tokenized, encoding="utf-8") as handle:
        return sum(min(len(json.loads(line)["input_ids"]), cap) for line in handle if line.strip())


def _gb(value: float) -> str:
    return f"{value / GB:.1f}"


def format_report(report: PlanReport) -> str:
    """The printed plan: inputs, every term, the peak and verdict, changes that fit, cache size."""
    s, cfg, plan, device = report.shapes, report.plan.settings, report.plan, report.device
    precision = "bf16 autocast" if cfg.act_bytes == 2 else "float32"
    features = "online (the target runs in each step)" if cfg.online else "offline (cache)"
    lines = [
        f"plan for {report.recipe} on {cfg.processes} x {device.name} "
        f"({_gb(device.memory)} GB each){', ' + cfg.sharding if cfg.processes > 1 else ''}",
        f"target {report.target}: {s.target_params / 1e9:.2f}B parameters, "
        f"{'bf16' if cfg.target_bytes == 2 else 'float32'} (config: {s.config_source})",
        f"drafter: {s.drafter_trainable / 1e6:.1f}M trained + {s.drafter_frozen / 1e6:.1f}M "
        f"frozen parameters (counted on the meta device); batch {cfg.batch} x {cfg.length} "
        f"tokens, {s.ttt_steps} TTT steps, {precision}, features {features}",
        "memory per rank (GB):",
    ]
    width = max(len(t.name) for t in plan.terms) + 2
    for phase, title in (("static", "held all run"), ("forward", "target forward (online)"),
                         ("step", "drafter step")):
        terms = [t for t in plan.terms if t.phase == phase]
        if not terms:
            continue
        lines.append(f"  {title}: {_gb(plan.phase(phase))}")
        lines += [f"    {t.name:{width}s}{_gb(t.bytes):>8s}" for t in terms]
    both = f"{_gb(plan.phase('forward'))} + {_gb(plan.phase('step'))} (train.overlap_target)" \
        if cfg.overlap else f"max({_gb(plan.phase('forward'))}, {_gb(plan.phase('step'))})"
    lines.append(f"  peak: {_gb(plan.phase('static'))} + {both} = {_gb(plan.peak)} GB of "
                 f"{_gb(device.memory)}: "
                 f"{report.verdict.upper()}"
                 + (f" (above {FITS_BELOW:.0%}: allocator fragmentation may break it)"
                    if report.verdict == "tight" else ""))
    if report.verdict != "fits":
        if report.changes:
            lines.append("  to fit, one of:")
            lines += [f"    {c.what}: {_gb(c.peak)} GB" for c in report.changes]
        else:
            lines.append("  no single change fits: combine a smaller batch, a shorter max length "
                         "and gradient checkpointing, or use a GPU with more memory")
    per_token = cache_bytes_per_token(s, cfg.cache_bytes)
    compact = cache_bytes_per_token(s, 1 + 4 / s.hidden)
    tokens = report.data_tokens
    size = (f"{tokens:,} tokens prepared: {_gb(tokens * per_token)} GB" if tokens is not None
            else f"{_gb(1e6 * per_token)} GB per million tokens")
    lines.append(f"offline cache ({s.hidden_indices} hidden states per token): {per_token:,.0f} "
                 f"bytes/token; {size}; {compact:,.0f} bytes/token with 1-byte values and a "
                 "float32 scale per row")
    return "\n".join(lines)
