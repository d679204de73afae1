"""The training loop: one loop for every drafter kind, on accelerate (CPU, one GPU, DDP or FSDP).

Reads top to bottom: set up accelerate, load the frozen target, build the drafter from the
registry, split the data, optionally resume (the same run only, see resume.py), then per step
compute the target's features (online) and the drafter's own loss; never branches on the kind.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from draftsmith.data.shards import budget_line
from draftsmith.errors import DraftsmithError
from draftsmith.models.layers import set_gradient_checkpointing
from draftsmith.precision import choose_mixed_precision
from draftsmith.process_group import leave_process_group
from draftsmith.registry import get_spec
from draftsmith.train.batching import ExampleBatches
from draftsmith.train.budget import BudgetPlanner, StepSchedule, revised_total
from draftsmith.train.cache_stream import CacheStream
from draftsmith.train.checkpoint import save_drafter, save_state
from draftsmith.train.divergence import check_loss, check_weights
from draftsmith.train.draft_vocab import install_draft_vocab
from draftsmith.train.joint import wrap_with_lora
from draftsmith.train.loss_module import LossModule, init_from_first_batch
from draftsmith.train.metrics import MetricsLog, simulated_tau
from draftsmith.train.optimizers import build_optimizer
from draftsmith.train.recipe import Recipe
from draftsmith.train.resume import (
    changed_settings,
    check_same_run,
    find_resume_checkpoint,
    flatten_settings,
    load_checkpoint,
    read_progress,
    run_record,
    scheduler_state,
    setting_differences,
)
from draftsmith.train.stop_signal import StopRequest, stop_exit_code
from draftsmith.train.target_parts import gathered, holds_whole, local_numel


def make_accelerator(recipe: Recipe):
    """Accelerator on CUDA when present, else CPU (so `--multi_gpu` on a CPU host gives a real
    multi-process gloo run; `--cpu --num_processes 2` would silently start one process)."""
    from accelerate import Accelerator

    log_with = None
    if recipe.train.wandb:
        if not os.environ.get("WANDB_API_KEY"):
            os.environ.setdefault("WANDB_MODE", "offline")
        log_with = "wandb"
    mixed_precision, reason = choose_mixed_precision(
        recipe.train.mixed_precision, "cuda" if torch.cuda.is_available() else "cpu")
    if recipe.train.mixed_precision == "auto" and int(os.environ.get("RANK", "0")) == 0:
        print(f"mixed precision: {mixed_precision} ({reason})", file=sys.stderr)
    return Accelerator(
        cpu=not torch.cuda.is_available(),
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=recipe.train.grad_accum,
        log_with=log_with,
        project_dir=recipe.train.output_dir,
    )


@torch.no_grad()
def evaluate(model: LossModule, batches, accelerator) -> dict:
    """Mean per-position accuracy (against the target's own choices) and simulated tau, over
    every process's held-out batches. Every process reaches the one collective whatever its data
    held (a process without a batch adds nothing), so none waits for one that returned early."""
    from accelerate.utils import gather_object

    model.eval()
    sums: dict[str, float] = {}
    count = 0
    for batch in batches:
        _, metrics = model({k: v.to(accelerator.device) for k, v in batch.items()})
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value)
        count += 1
    model.train()
    parts = gather_object([(sums, count)]) if accelerator.num_processes > 1 else [(sums, count)]
    total = sum(n for _, n in parts)
    if not total:
        return {}
    keys = sorted({key for part, _ in parts for key in part})
    means = {k: sum(part.get(k, 0.0) for part, _ in parts) / total for k in keys}
    accs = [means[f"acc_{k}"] for k in range(len(means)) if f"acc_{k}" in means]
    return {**{f"eval/{k}": v for k, v in means.items()}, "eval/simulated_tau": simulated_tau(accs)}


def run_training(recipe: Recipe, examples: list[dict] | CacheStream, target=None,
                 accelerator=None, draft_vocab=None) -> Path:
    """Train a drafter on tokenized `examples` ({"input_ids", "loss_mask"} lists of ints), or on
    batches streamed from the offline cache.

    Args:
        recipe: validated recipe.
        examples: the training data (rendered conversations), or this rank's `CacheStream`.
        target: an already loaded frozen target model (tests); None loads `recipe.target`.
        accelerator: an existing Accelerator; None creates one from the recipe.
        draft_vocab: EAGLE-3 draft vocabulary (d2t / t2d) built from the data, or None.

    Returns:
        The folder of the final drafter (safetensors + config).
    """
    from accelerate.utils import set_seed

    cfg = recipe.train
    finished = _finished_drafter(Path(cfg.output_dir), recipe)
    if finished is not None:
        print(f"{finished} is already trained by this recipe; delete it or set another "
              "train.output_dir to train again", file=sys.stderr)
        return finished
    start = time.perf_counter()  # train.max_minutes counts from here to saving the drafter
    accelerator = accelerator or make_accelerator(recipe)
    set_seed(cfg.seed)
    out_dir = Path(cfg.output_dir)
    spec = get_spec(recipe.kind)
    drafter_config = recipe.drafter_config()

    if target is None:
        target = recipe.target.load(device="cpu").model
    target.requires_grad_(False).eval()
    if holds_whole(target):  # a sharded or partly loaded target is already on its device
        target.to(accelerator.device)
    data = examples if isinstance(examples, CacheStream) else \
        ExampleBatches(examples, cfg, accelerator)
    record = run_record(recipe, target, data.fingerprint(), accelerator.num_processes)
    drafter = spec.build(target.config, drafter_config)
    if spec.uses_draft_vocab:
        install_draft_vocab(drafter, draft_vocab, target.config.get_text_config().vocab_size)
    with gathered(target.get_input_embeddings(), target.get_output_embeddings()):
        drafter.init_from_target(target)
    if cfg.gradient_checkpointing and not set_gradient_checkpointing(drafter, True):
        accelerator.print(f"train.gradient_checkpointing: the {recipe.kind} drafter has no "
                          "decoder layer to recompute; nothing changes")
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
    # (accelerate's sample-based convention), so it is stepped here, and its position is saved in
    # progress.json (accelerate's custom-object checkpoints are pickles it loads unguarded).

    step, progress_state = 0, {}
    resume = find_resume_checkpoint(accelerator, out_dir)
    if resume is not None:  # a refused resume changes nothing (the metrics log is cut after)
        progress_state = read_progress(resume)
        check_same_run(resume, progress_state, record)
        load_checkpoint(accelerator, resume, scheduler, progress_state)
        step = progress_state["step"]
        schedule.total = progress_state["total_steps"]
        accelerator.print(f"resuming from {resume} at step {step} of {schedule.total}")
        minutes_then = progress_state["run"]["settings"].get("train.max_minutes")
        if cfg.max_minutes is not None and minutes_then not in (None, cfg.max_minutes):
            accelerator.print(f"train.max_minutes={cfg.max_minutes:g} (the run started with "
                              f"{minutes_then:g}): the rest of the run is planned to the new "
                              "budget, minutes spent before included")
    # with a budget the total follows the measured pace (`planned`: the total is final); a
    # resumed run starts from its checkpoint's total, schedule and minutes spent
    budget = progress_state.get("budget") or {}
    planner = None if cfg.max_minutes is None or progress_state.get("planned", False) else \
        BudgetPlanner(cfg.max_minutes * 60, cfg.max_steps, budget.get("spent_seconds", 0.0))
    plans = budget.get("plans", 0)  # plans made so far (the first one is always taken)
    if budget.get("anchor"):
        schedule.anchor = tuple(budget["anchor"])

    if cfg.wandb:
        accelerator.init_trackers(cfg.wandb_project, config=recipe.to_dict())
    log = MetricsLog(out_dir / "metrics.jsonl", accelerator)
    log.truncate_after(step)
    if resume is not None:  # the rows after it count `seconds` from this process's start
        log.write({"step": step, "resumed": 1})
    held = accelerator.gather(torch.tensor([local_numel(target)], device=accelerator.device))
    held = [int(n) for n in held]  # recorded with the drafter: the target's share on each rank
    accelerator.print(f"frozen target parameters held per rank: {', '.join(f'{n:,}' for n in held)}")
    micro_per_epoch = data.batches_per_epoch
    micro_done = step * cfg.grad_accum  # where the data stream is: epoch and batches done
    if "data_stream" in progress_state:  # recorded by checkpoints since the streamed cache
        stream = progress_state["data_stream"]
        micro_done = stream["epoch"] * micro_per_epoch + stream["batches_done"]
    progress = _progress_bar(accelerator, schedule.total, step)
    step_tokens = 0  # real (unpadded) tokens of this optimizer step on this process
    padded_tokens = 0  # and with padding: what the step computes on (its cost)
    paused = False  # an evaluation or a checkpoint ran since the last step
    with StopRequest() as stop_request:  # SIGTERM / Ctrl-C: save after the step, then exit
        while step < schedule.total:
            epoch = micro_done // micro_per_epoch
            for batch in data.train_batches(epoch, micro_done - epoch * micro_per_epoch):
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                with accelerator.accumulate(model):
                    with accelerator.autocast():
                        loss, metrics = model(batch)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and cfg.clip > 0:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.clip)
                    optimizer.step()
                    if accelerator.sync_gradients:
                        scheduler.step()
                    optimizer.zero_grad()
                micro_done += 1
                step_tokens += int(batch["attention_mask"].sum())
                padded_tokens += batch["input_ids"].numel()
                if not accelerator.sync_gradients:
                    continue
                step += 1
                loss, metrics = mean_over_processes(accelerator, loss, metrics)
                # summed with this step's tokens: a stop requested on any process stops every one
                counts = accelerator.reduce(torch.tensor(
                    [step_tokens, *stop_request.counts()], device=accelerator.device), "sum")
                tokens, stop_code = int(counts[0]), stop_exit_code(*counts[1:].tolist())
                stopping = stop_code is not None
                step_tokens = 0
                loss = float(loss)  # the step's one read of the loss (the same on every rank)
                check_loss(loss, step, cfg, out_dir)
                row = {"step": step, "loss": loss, "lr": scheduler.get_last_lr()[0],
                       **{k: float(v) for k, v in metrics.items()}, "tokens": tokens,
                       "seconds": time.perf_counter() - start}
                log.write(row)
                progress.update(1)
                progress.set_postfix(loss=f"{loss:.3f}",
                                     acc0=f"{float(metrics['acc_0']):.2f}")
                if planner is not None:
                    revisable = schedule.revisable(step)
                    planner.record(row["seconds"], padded_tokens, paused)
                    # an eval batch costs <= a step
                    final_steps = data.num_eval_batches() / cfg.grad_accum
                    if planner.ready() and step < schedule.total and _plan_total(
                            accelerator, cfg, planner, schedule, step, row["seconds"], final_steps,
                            plans == 0, log):
                        plans += 1
                        progress.total = schedule.total
                        progress.refresh()
                    if plans and revisable and not schedule.revisable(step):
                        accelerator.print(
                            f"train.max_minutes={cfg.max_minutes:g}: {schedule.total} steps from "
                            f"step {step} on ({cfg.schedule}: a new total would change the "
                            "learning rate); only a pace that would miss the budget re-times the "
                            "rest of the decay")
                padded_tokens, paused = 0, False
                if cfg.eval_every and step % cfg.eval_every == 0 and step < schedule.total \
                        and not stopping:  # a stop saves at once
                    log.write({"step": step, **evaluate(model, data.eval_batches(), accelerator)})
                    paused = True
                if (stopping or (cfg.save_every and step % cfg.save_every == 0)) and \
                        step < schedule.total:
                    spent = {} if planner is None else {"budget": {
                        "spent_seconds": planner.spent_before + row["seconds"], "plans": plans,
                        "anchor": schedule.anchor}}
                    stream = {"epoch": micro_done // micro_per_epoch,
                              "batches_done": micro_done % micro_per_epoch}
                    check_weights(accelerator, model, step, cfg, out_dir)
                    save_state(accelerator, out_dir, step,
                               {"total_steps": schedule.total, "planned": planner is None, **spent,
                                "scheduler": scheduler_state(scheduler), "run": record,
                                "data_stream": stream},
                               keep=cfg.keep_checkpoints)
                    paused = True
                if stopping and step < schedule.total:
                    _stop(accelerator, progress, stop_code, step, out_dir)
                if step >= schedule.total:
                    break
    progress.close()
    final_eval = evaluate(model, data.eval_batches(), accelerator)
    log.write({"step": step, **final_eval})
    check_weights(accelerator, model, step, cfg, out_dir)
    unwrapped = accelerator.unwrap_model(model)
    # the budget clock over every process of the run, where it ran with one from the start
    spent = None if cfg.max_minutes is None or not (planner or "spent_seconds" in budget) else \
        time.perf_counter() - start + (planner.spent_before if planner else budget["spent_seconds"])
    path = save_drafter(accelerator, unwrapped.drafter, recipe, target.config, step, final_eval,
                        out_dir, lora_target=unwrapped.target if joint else None,
                        target_parameters_per_rank=held, train_seconds=spent)
    if spent is not None:
        accelerator.print(budget_line("train.max_minutes", spent, cfg.max_minutes)
                          + f", {step} steps, from building the drafter to saving it")
    accelerator.end_training()
    leave_process_group(finished=True)  # several CPU processes end here, their models still held
    return path


def mean_over_processes(accelerator, loss: torch.Tensor, metrics: dict
                        ) -> tuple[torch.Tensor, dict]:
    """The step's loss and metrics averaged over processes (each computed its own batch's), so
    the log shows the whole batch's: equal to one process's run on it when the processes' shares
    weigh the same (equal trained-token counts)."""
    names = sorted(metrics)
    local = torch.stack([loss.detach().float().reshape(()), *(
        torch.as_tensor(metrics[k], dtype=torch.float32, device=loss.device).reshape(())
        for k in names)])
    mean = accelerator.reduce(local, reduction="mean")
    return mean[0], dict(zip(names, mean[1:], strict=True))


def _finished_drafter(out_dir: Path, recipe: Recipe) -> Path | None:
    """OUTPUT_DIR/drafter when it holds a drafter trained by this very recipe; None when it holds
    no finished drafter.

    Raises:
        DraftsmithError: it holds one trained by another recipe, which a run here would overwrite
            (its weights and its metrics.jsonl), naming the settings that differ.
    """
    path = out_dir / "drafter" / "draftsmith_drafter.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    now, then = json.loads(json.dumps(recipe.to_dict(), default=str)), meta.get("recipe")
    if now == then:
        return path.parent
    if not isinstance(then, dict):
        return None  # written before drafters recorded their recipe
    then, now = flatten_settings(then), flatten_settings(now)
    changed = changed_settings(then, now)
    shown = setting_differences(then, now, changed[:4], "there")
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    raise DraftsmithError(
        f"{path.parent} holds a drafter trained by another recipe ({shown}{more}); training here "
        "would overwrite it and its metrics.jsonl: set another train.output_dir, or delete "
        f"{out_dir} to train this recipe there")


def _plan_total(accelerator, cfg, planner: BudgetPlanner, schedule: StepSchedule, step: int,
                clock: float, final_steps: float, first: bool, log) -> bool:
    """Plan (first) or revise the run's total from the measured pace, the same total on every
    rank (rank 0's measurement decides); a change is logged (metrics.jsonl: `planned_steps`,
    `previous_planned_steps`, `seconds_per_step`, `tokens_per_second`, `retimed`) and printed.
    Returns whether the total changed."""
    from accelerate.utils import broadcast

    measured = torch.tensor([planner.plan(step, clock, final_steps), planner.seconds_per_step()],
                            dtype=torch.float64, device=accelerator.device)
    measured = broadcast(measured, from_process=0).tolist()
    wanted, per_step, rate = int(measured[0]), measured[1], planner.tokens_per_second()
    total = revised_total(schedule, step, wanted, first, per_step, planner.budget_seconds)
    if total is None:
        return False
    previous = schedule.total
    retimed = not schedule.revisable(step) or total < schedule.earliest_total(step)
    schedule.revise(step, total)
    row = {"step": step, "seconds_per_step": per_step, "tokens_per_second": rate,
           "planned_steps": total}
    pace = f"{per_step:.2f} s/step ({rate or 0:,.0f} padded tokens/s over the last " \
           f"{len(planner.window)} steps)"
    if first:
        accelerator.print(f"train.max_minutes={cfg.max_minutes:g}: {pace} measured here, so "
                          f"{total} steps in all (train.max_steps={cfg.max_steps})")
        if total <= cfg.warmup_steps:
            accelerator.print(f"warning: {total} steps do not finish the {cfg.warmup_steps}-step "
                              "warmup; lower train.warmup_steps or raise train.max_minutes")
    else:
        row["previous_planned_steps"] = previous
        how = ", the rest of the decay re-timed" if retimed else ""
        if retimed:
            row["retimed"] = True
        accelerator.print(f"train.max_minutes={cfg.max_minutes:g}: at step {step}, {pace}: "
                          f"{previous} -> {total} steps in all{how}")
    log.write(row)
    return True


def _stop(accelerator, progress, code: int, step: int, out_dir: Path) -> None:
    """End a run stopped by a signal once its checkpoint is saved: every rank exits with `code`."""
    progress.close()
    accelerator.print(f"train: stopped after step {step} by a signal; checkpoint "
                      f"{out_dir / 'checkpoints' / f'step_{step}'} saved; run the same command "
                      "to resume from it")
    accelerator.end_training()  # trackers finished, the process group left (as at the end)
    raise SystemExit(code)


def _progress_bar(accelerator, total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step",
                disable=not accelerator.is_main_process)
