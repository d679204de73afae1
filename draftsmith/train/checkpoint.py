"""Checkpoints: resumable training state (accelerate) and the final drafter (safetensors + JSON).

Both are written to a temporary folder and renamed, so a crash never leaves a checkpoint that
looks complete but is not.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.drafter_folder import write_drafter_folder


def _state_dir(out_dir: Path) -> Path:
    return out_dir / "checkpoints"


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete training-state checkpoint, or None."""
    folder = _state_dir(out_dir)
    done = [p for p in folder.glob("step_*") if (p / "progress.json").is_file()]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


def save_state(accelerator, out_dir: Path, step: int, total_steps: int, planned: bool) -> Path:
    """Model, optimizer, scheduler and RNG states plus the step (the data position) and the run's
    total steps (fixed by `train.max_minutes`, so a resumed run keeps its schedule)."""
    final = _state_dir(out_dir) / f"step_{step}"
    tmp = final.with_name(final.name + ".partial")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / "progress.json").write_text(json.dumps(
            {"step": step, "total_steps": total_steps, "planned": planned}) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        tmp.replace(final)
    accelerator.wait_for_everyone()
    return final


def _custom_template(recipe) -> str | None:
    """The text of the recipe's own chat template (None: the tokenizer's), so evaluation renders
    prompts the way the drafter saw them in training."""
    from draftsmith.data.render import resolve_chat_template

    custom = recipe.data.get("chat_template")
    return resolve_chat_template(None, custom) if custom else None


def save_drafter(accelerator, drafter: torch.nn.Module, recipe, target_config, step: int,
                 eval_metrics: dict, out_dir: Path, lora_target=None) -> Path:
    """Save the trained drafter's weights and what is needed to rebuild and check it; with a
    LoRA-trained target (Medusa-2) its adapter goes to `lora/` (safetensors)."""
    from draftsmith.registry import get_spec

    final = out_dir / "drafter"
    state = accelerator.get_state_dict(drafter)
    if accelerator.is_main_process:
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()
                   if not k.startswith("rotary.")}
        config = recipe.drafter_config()
        meta = {
            "kind": recipe.kind,
            "drafter_config": asdict(config),
            "target": recipe.target.name,
            "target_config": target_config.to_dict(),
            "aux_layers": list(get_spec(recipe.kind).aux_layers(target_config.num_hidden_layers,
                                                                config)),
            "training_steps": step,
            "num_processes": accelerator.num_processes,
            "lora": lora_target is not None,
            "eval": eval_metrics,
            "chat_template": _custom_template(recipe),
            "recipe": recipe.to_dict(),
        }
        write_drafter_folder(final, tensors, meta, lora_target)
    accelerator.wait_for_everyone()
    return final
