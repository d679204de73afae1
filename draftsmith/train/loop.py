"""The training loop: one loop for every drafter kind, on accelerate (CPU, one GPU, DDP or FSDP).

Reads top to bottom: `run_training` sets up accelerate and the run's parts (`setup.py`: target,
data, drafter from the registry, optimizer), and a `Trainer` resumes the same run if it can
(`resume.py`), then steps: the drafter's own loss on the target's features (online or cached),
never a branch on the kind. Each concern of a step is a part of its own: the budget
(`budget_clock.py`), stop signals (`stop_signal.py`), the held-out evaluation (`evaluation.py`),
checkpoints (`checkpoint.py`), divergence (`divergence.py`) and the metrics log (`metrics.py`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import torch

from draftsmith.data.shards import budget_line
from draftsmith.errors import DraftsmithError
from draftsmith.process_group import leave_process_group
from draftsmith.target.precision import choose_mixed_precision
from draftsmith.train.budget_clock import BudgetClock
from draftsmith.train.cache_stream import CacheStream
from draftsmith.train.checkpoint import check_shared_output, save_drafter, save_state
from draftsmith.train.divergence import check_loss, check_weights
from draftsmith.train.evaluation import evaluate
from draftsmith.train.loader import device_batches
from draftsmith.train.loss_module import batch_features
from draftsmith.train.metrics import LogWindow, MetricsLog
from draftsmith.train.recipe import Recipe
from draftsmith.train.resume import finished_drafter, resume_run, scheduler_state
from draftsmith.train.setup import TrainingSetup, build_training
from draftsmith.train.stop_signal import StopRequest, stop_exit_code
from draftsmith.train.target_ahead import check_overlap, features_ahead, target_forward
from draftsmith.train.target_parts import holds_whole, local_numel


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

    finished = finished_drafter(Path(recipe.train.output_dir), recipe)
    if finished is not None:
        print(f"{finished} is already trained by this recipe; delete it or set another "
              "train.output_dir to train again", file=sys.stderr)
        return finished
    start = time.perf_counter()  # train.max_minutes counts from here to saving the drafter
    accelerator = accelerator or make_accelerator(recipe)
    set_seed(recipe.train.seed)
    if target is None:
        target = recipe.target.load(device="cpu").model
    trainer = Trainer(recipe, build_training(recipe, examples, target, accelerator, draft_vocab),
                      accelerator, start)
    trainer.fit()
    return trainer.finish()


class Trainer:
    """One run's steps over its parts: resumed from its newest checkpoint where it has one,
    then `fit` (the optimizer steps, with evaluations, checkpoints, the budget's plans and a stop
    on a signal) and `finish` (the final evaluation and the drafter saved).

    Args:
        recipe: the validated recipe.
        parts: the run's built parts (`build_training`).
        accelerator: the run's Accelerator.
        start: the run's clock at its start (`time.perf_counter()`; the budget counts from it).
    """

    def __init__(self, recipe: Recipe, parts: TrainingSetup, accelerator, start: float):
        self.recipe, self.cfg, self.parts = recipe, recipe.train, parts
        self.accelerator, self.start = accelerator, start
        self.out_dir = Path(self.cfg.output_dir)
        check_shared_output(accelerator, self.out_dir)
        self.step, progress = resume_run(accelerator, self.out_dir, parts.record,
                                         parts.scheduler, parts.schedule, self.cfg)
        if self.cfg.wandb:
            accelerator.init_trackers(self.cfg.wandb_project, config=recipe.to_dict())
        self.log = MetricsLog(self.out_dir / "metrics.jsonl", accelerator)
        self.log.truncate_after(self.step)
        if progress:  # the rows after it count `seconds` from this process's start
            self.log.write({"step": self.step, "resumed": 1})
        self.budget = BudgetClock(self.cfg, parts.schedule, progress, accelerator, self.log)
        held = accelerator.gather(torch.tensor([local_numel(parts.target)],
                                               device=accelerator.device))
        self.held = [int(n) for n in held]  # recorded with the drafter: each rank's target share
        accelerator.print("frozen target parameters held per rank: "
                          f"{', '.join(f'{n:,}' for n in self.held)}")
        # where the data stream is (recorded since the cache stream; before, every epoch of a
        # checkpoint's run was as long as the first)
        stream = progress.get("data_stream") or {
            "epoch": 0, "batches_done": self.step * self.cfg.grad_accum}
        self.epoch, self.batches_done = stream["epoch"], stream["batches_done"]
        self._next_epoch_if_done()
        self.padded_tokens = 0  # tokens of this optimizer step with padding: its cost (host)
        self.paused = False  # an evaluation or a checkpoint ran since the last step
        self.last: tuple = ()  # the latest micro-step's (loss, metrics)
        self.window = LogWindow(accelerator, self.step)
        check_overlap(self.cfg.overlap_target, parts.target, parts.joint)
        self.overlap = not parts.joint and self.cfg.overlaps_target(
            accelerator.device.type, accelerator.num_processes) and holds_whole(parts.target)
        if self.overlap:
            accelerator.print("target: each batch's features computed on a second thread while "
                              "the step before trains (train.overlap_target=false: in the step)")
        self.progress = None

    def fit(self) -> None:
        """Optimizer steps until the schedule's total (which a budget may re-plan); a stop signal
        saves a checkpoint after the step in progress and ends the process (`_stop`)."""
        data, schedule = self.parts.data, self.parts.schedule
        self.progress = _progress_bar(self.accelerator, schedule.total, self.step)
        with StopRequest() as stop_request:  # SIGTERM / Ctrl-C: save after the step, then exit
            while self.step < schedule.total:
                batches = data.train_batches(self.epoch, self.batches_done, float8=True)
                with closing(device_batches(batches, self.accelerator.device)) as fed, \
                        closing(self._ahead(fed)) as stream:
                    for batch in stream:
                        if self._micro_step(batch) and self._end_step(stop_request):
                            break
        self.progress.close()

    def _ahead(self, fed: Iterator[dict]) -> Iterator[dict]:
        """The device's batches, with the next one's target features computed on a second thread
        while this step trains (`train.overlap_target`), or as they are."""
        if not self.overlap:
            yield from fed
            return
        unwrapped = self.accelerator.unwrap_model(self.parts.model)
        target, aux_layers = self.parts.target, unwrapped.aux_layers
        yield from features_ahead(fed, target_forward(
            lambda batch: batch_features(target, batch, aux_layers), self.accelerator.autocast,
            unwrapped.drafter))

    def _next_epoch_if_done(self) -> None:
        """Move the data stream's position past the epochs it has finished.

        Raises:
            DraftsmithError: an epoch without a batch (too little data for the processes).
        """
        while self.batches_done >= (length := self.parts.data.epoch_length(self.epoch)):
            if length == 0:
                raise DraftsmithError(f"epoch {self.epoch} has no batch for "
                                      f"{self.accelerator.num_processes} process(es): add data or "
                                      "use fewer processes")
            self.epoch, self.batches_done = self.epoch + 1, self.batches_done - length

    def finish(self) -> Path:
        """The final evaluation, then the drafter saved (with the budget's minutes spent)."""
        accelerator, parts = self.accelerator, self.parts
        final_eval = evaluate(parts.model, parts.data.eval_batches(), accelerator)
        self.log.write({"step": self.step, **final_eval})
        check_weights(accelerator, parts.model, self.step, self.cfg, self.out_dir)
        unwrapped = accelerator.unwrap_model(parts.model)
        spent = self.budget.spent(time.perf_counter() - self.start)
        path = save_drafter(accelerator, unwrapped.drafter, self.recipe, parts.target.config,
                            self.step, final_eval, self.out_dir,
                            lora_target=unwrapped.target if parts.joint else None,
                            target_parameters_per_rank=self.held, train_seconds=spent)
        if spent is not None:
            accelerator.print(budget_line("train.max_minutes", spent, self.cfg.max_minutes)
                              + f", {self.step} steps, from building the drafter to saving it")
        for tracker in accelerator.trackers:  # not end_training: it tears a gloo group down, which
            tracker.finish()  # can abort a rank at exit (see leave_process_group)
        leave_process_group(finished=True)  # several CPU processes end here, models still held
        return path

    def _micro_step(self, batch: dict) -> bool:
        """Forward, backward and (at the end of an accumulation) the optimizer's step on one
        batch (already on the device). Returns whether an optimizer step ended."""
        accelerator, model, cfg = self.accelerator, self.parts.model, self.cfg
        with accelerator.accumulate(model):
            with accelerator.autocast():
                loss, metrics = model(batch)
            accelerator.backward(loss)
            if accelerator.sync_gradients and cfg.clip > 0:
                accelerator.clip_grad_norm_(model.parameters(), cfg.clip)
            self.parts.optimizer.step()
            if accelerator.sync_gradients:
                self.parts.scheduler.step()
            self.parts.optimizer.zero_grad()
        self.batches_done += 1
        self._next_epoch_if_done()
        self.window.add_tokens(batch["attention_mask"])
        self.padded_tokens += batch["input_ids"].numel()
        self.last = (loss, metrics)
        return accelerator.sync_gradients

    def _end_step(self, stop_request: StopRequest) -> bool:
        """After an optimizer step: its loss and metrics added to the log window; the window's
        row (its one read of the device) when due; the budget's plan; an evaluation and a
        checkpoint when due, a stop when signalled. Returns whether the run has reached its
        total."""
        schedule = self.parts.schedule
        self.step += 1
        self.window.add_step(*self.last)
        clock = time.perf_counter() - self.start
        stop_code, logged = None, self._row_due(stop_request)
        if logged:
            stop_code = self._write_row(stop_request, clock)
        self.progress.update(1)
        final_steps = self.parts.data.num_eval_batches() / self.cfg.grad_accum  # <= a step each
        if self.budget.after_step(self.step, clock, self.padded_tokens, self.paused, final_steps):
            self.progress.total = schedule.total
            self.progress.refresh()
        if not logged and self.step >= schedule.total:  # the budget made this step the last
            stop_code = self._write_row(stop_request, clock)
        self.padded_tokens, self.paused = 0, False
        self._evaluate_or_save(clock, stop_code)
        return self.step >= schedule.total

    def _row_due(self, stop_request: StopRequest) -> bool:
        """A metrics row is written every `log_interval` steps, at the last step, before a
        checkpoint (the loss is checked before anything is saved) and, with one process, at a
        stop signal (several processes learn of one at a row: it is reduced there)."""
        cfg, step = self.cfg, self.step
        return (step % cfg.log_interval == 0 or step >= self.parts.schedule.total
                or bool(cfg.save_every and step % cfg.save_every == 0)
                or (self.accelerator.num_processes == 1 and stop_request.counts()[0] > 0))

    def _write_row(self, stop_request: StopRequest, clock: float) -> int | None:
        """The window's row: its means over steps and processes, read from the device once;
        the loss checked for NaN. Returns the stop's exit code when some process was signalled."""
        first = self.window.first_step
        loss, metrics, tokens, stops = self.window.read(stop_request.counts())
        check_loss(loss, self.step if first == self.step else f"{first}-{self.step}", self.cfg,
                   self.out_dir)
        self.log.write({"step": self.step, "loss": loss,
                        "lr": self.parts.scheduler.get_last_lr()[0], **metrics,
                        "tokens": tokens, "seconds": clock})
        self.progress.set_postfix(loss=f"{loss:.3f}", acc0=f"{metrics.get('acc_0', 0.0):.2f}")
        return stop_exit_code(*stops)

    def _evaluate_or_save(self, clock: float, stop_code: int | None) -> None:
        """The held-out evaluation every `train.eval_every` steps and a checkpoint every
        `train.save_every` (or at once on a stop, which then ends the process), before the
        total; the final step's come from `finish`."""
        cfg, step = self.cfg, self.step
        if step >= self.parts.schedule.total:
            return
        stopping = stop_code is not None
        if cfg.eval_every and step % cfg.eval_every == 0 and not stopping:  # a stop saves at once
            self.log.write({"step": step, **evaluate(self.parts.model,
                                                     self.parts.data.eval_batches(),
                                                     self.accelerator)})
            self.paused = True
        if stopping or (cfg.save_every and step % cfg.save_every == 0):
            self._save_checkpoint(clock)
            self.paused = True
        if stopping:
            _stop(self.accelerator, self.progress, stop_code, step, self.out_dir)

    def _save_checkpoint(self, clock: float) -> None:
        """Checkpoint `step_N`, once every weight is finite: the state, the schedule's total and
        position, the budget's state, the run's record and where the data stream is."""
        parts = self.parts
        check_weights(self.accelerator, parts.model, self.step, self.cfg, self.out_dir)
        stream = {"epoch": self.epoch, "batches_done": self.batches_done}
        save_state(self.accelerator, self.out_dir, self.step,
                   {"total_steps": parts.schedule.total, **self.budget.state(clock),
                    "scheduler": scheduler_state(parts.scheduler), "run": parts.record,
                    "data_stream": stream},
                   keep=self.cfg.keep_checkpoints)


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
