"""Everything a training run is built from before its first step, in one typed bundle: the
frozen target placed on its device, the data as the loop reads it, the drafter built from the
registry and started from the target (and from the data, where the kind does so), the module
DDP/FSDP wraps, the optimizer and the learning-rate schedule, all prepared by accelerate."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.draft_vocab.drafter import install_draft_vocab
from draftsmith.models.layers import compile_layers, set_gradient_checkpointing
from draftsmith.models.row_buckets import bucket_rows
from draftsmith.registry import DrafterSpec, get_spec
from draftsmith.train.batching import ExampleBatches, collate_rows_of
from draftsmith.train.budget import StepSchedule
from draftsmith.train.cache_stream import CacheStream
from draftsmith.train.joint import wrap_with_lora
from draftsmith.train.loss_module import LossModule, init_from_first_batch
from draftsmith.train.optimizers import build_optimizer
from draftsmith.train.recipe import Recipe
from draftsmith.train.resume import run_record
from draftsmith.train.target_parts import gathered, holds_whole


@dataclass
class TrainingSetup:
    """A run's parts, built once (`build_training`) and read by the loop.

    Attributes:
        spec, drafter_config: the kind's registry entry and its validated settings.
        target: the frozen target (peft-wrapped when trained jointly: Medusa-2).
        data: the batches (`ExampleBatches` in memory, or this rank's `CacheStream`).
        record: what a checkpoint records of the run (settings, target and data fingerprints).
        model: the prepared `LossModule` (drafter, and the target's adapters when joint).
        optimizer, scheduler: prepared by accelerate; the scheduler is stepped by the loop.
        schedule: the learning-rate multiplier per optimizer step (its total may be re-planned).
        joint: whether the target trains through LoRA.
    """

    spec: DrafterSpec
    drafter_config: object
    target: torch.nn.Module
    data: ExampleBatches | CacheStream
    record: dict
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    schedule: StepSchedule
    joint: bool


def build_training(recipe: Recipe, examples, target, accelerator, draft_vocab) -> TrainingSetup:
    """Build every part of a run on `accelerator` (see `TrainingSetup`).

    Args:
        recipe: the validated recipe.
        examples: tokenized examples, or this rank's `CacheStream` of the offline cache.
        target: the loaded frozen target (whole, sharded or partly loaded).
        accelerator: the run's Accelerator.
        draft_vocab: the draft vocabulary (d2t / t2d) for kinds that use one, else None.
    """
    cfg = recipe.train
    spec = get_spec(recipe.kind)
    drafter_config = recipe.drafter_config
    target.requires_grad_(False).eval()
    if holds_whole(target):  # a sharded or partly loaded target is already on its device
        target.to(accelerator.device)
    data = examples if isinstance(examples, CacheStream) else \
        ExampleBatches(examples, cfg, accelerator, collate_rows_of(recipe))
    record = run_record(recipe, target, data.fingerprint(), accelerator.num_processes)
    drafter = spec.build(target.config, drafter_config)
    if spec.uses_draft_vocab:
        install_draft_vocab(drafter, draft_vocab, target.config.get_text_config().vocab_size)
    with gathered(target.get_input_embeddings(), target.get_output_embeddings()):
        drafter.init_from_target(target)
    if cfg.gradient_checkpointing and not set_gradient_checkpointing(drafter, True):
        accelerator.print(f"train.gradient_checkpointing: the {recipe.kind} drafter has no "
                          "decoder layer to recompute; nothing changes")
    bucket_rows(drafter, cfg.row_multiple(accelerator.device.type, accelerator.mixed_precision))
    if cfg.compile and not compile_layers(drafter):
        accelerator.print(f"train.compile: the {recipe.kind} drafter has no decoder layer that "
                          "draftsmith compiles (EAGLE-1/3 and P-EAGLE have); nothing changes")
    aux_layers = spec.aux_layers(target.config.num_hidden_layers, drafter_config)
    joint = spec.trains_target(drafter_config)
    init_from_first_batch(drafter, target, data, aux_layers, accelerator)
    if joint:
        target = wrap_with_lora(target, drafter_config)
    model = LossModule(drafter, spec, target, aux_layers, joint)
    # Medusa-2: the backbone's adapters learn 4x slower than the heads
    optimizer = build_optimizer(drafter, cfg, [p for p in target.parameters() if p.requires_grad]
                                if joint else None, sharded=accelerator.distributed_type == "FSDP",
                                device=accelerator.device)
    schedule = StepSchedule(cfg.warmup_steps, cfg.max_steps, cfg.schedule, cfg.decay_fraction)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model, optimizer = accelerator.prepare(model, optimizer)
    # The schedule counts optimizer steps. A prepared scheduler would step once per process
    # (accelerate's sample-based convention), so the loop steps it, and its position is saved in
    # progress.json (accelerate's custom-object checkpoints are pickles it loads unguarded).
    return TrainingSetup(spec, drafter_config, target, data, record, model, optimizer, scheduler,
                         schedule, joint)
