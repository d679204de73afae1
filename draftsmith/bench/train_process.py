"""A benchmark's training stage runs `python -m draftsmith.train` in its own process, on the
benchmark's device, and passes a stop signal on to it (the run saves a checkpoint and the benchmark
resumes it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from draftsmith.bench.config import BenchConfig
from draftsmith.errors import DraftsmithError
from draftsmith.train import stop_signal


def run_training_process(config: BenchConfig, raw: dict, recipe_path: Path, log) -> None:
    """Run `python -m draftsmith.train` on a recipe in its own process."""
    from draftsmith.train.recipe import build_recipe

    build_recipe(raw)  # a bad override fails here, with the recipe's own error
    recipe_path.parent.mkdir(parents=True, exist_ok=True)
    recipe_path.write_text(f"# written by draftsmith bench from {config.path}\n"
                           + yaml.safe_dump(raw, sort_keys=False))
    log(f"$ {sys.executable} -m draftsmith.train --config {recipe_path}")
    process = subprocess.Popen([sys.executable, "-m", "draftsmith.train", "--config",
                                str(recipe_path)],
                               env={**os.environ, **training_devices(config.compute_device())})
    try:
        code = process.wait()
    except BaseException as err:  # Ctrl-C or SIGTERM: the training saves a checkpoint first
        stop_training(process, signal.SIGINT if isinstance(err, KeyboardInterrupt)
                      else signal.SIGTERM)
        raise
    if code != 0:
        raise DraftsmithError(training_failure(recipe_path, code))


def training_failure(recipe_path: Path, code: int) -> str:
    """The error for a training process that exited with `code` (not 0)."""
    if code in (128 + signal.SIGTERM, 128 + signal.SIGINT):
        return (f"training with {recipe_path} was stopped by {signal.Signals(code - 128).name} and "
                "saved a checkpoint; run the benchmark again to resume it")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return (f"training with {recipe_path} was killed by {name}; run the benchmark again to "
                "resume it from its last checkpoint")
    return (f"training with {recipe_path} failed (exit {code}); fix the error above and run the "
            "benchmark again (it resumes)")


def stop_training(process: subprocess.Popen, signum: int) -> None:
    """Pass a stop signal on to a training process and wait while it saves its checkpoint and
    exits. Signals that come meanwhile are passed on too, except within `REPEAT_SECONDS` of the
    first (a terminal's Ctrl-C pressed twice: the copies reach the training process directly, as
    one request); a later one makes it stop at once."""
    first = time.monotonic()

    def forward(received: int, frame) -> None:
        if time.monotonic() - first >= stop_signal.REPEAT_SECONDS and process.poll() is None:
            process.send_signal(received)

    previous = stop_signal.install_stop_handlers(forward)
    try:
        if process.poll() is None:
            process.send_signal(signum)
        process.wait()
    finally:
        stop_signal.restore_handlers(previous)


def training_devices(device: str) -> dict[str, str]:
    """The environment that makes a training process (which takes a GPU when it sees one) use
    `device`: no GPU for `cpu`, GPU N alone for `cuda:N`, the visible ones for `cuda`."""
    if device == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    index = device.partition(":")[2]
    return {"CUDA_VISIBLE_DEVICES": index} if index else {}
