"""Training metrics: the steps' values summed on the device between rows (`LogWindow`), a local
JSONL file written by rank 0 (and accelerate trackers), and the simulated acceptance length from
per-position accuracies."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.files import write_atomic


def simulated_tau(position_accuracies: list[float]) -> float:
    """Chain acceptance length implied by per-position accuracies: 1 + sum_k prod_{j<=k} acc_j.

    Treats each position's top-1 agreement with the target as the chance to accept that draft
    given the previous ones were accepted (the bonus token counts as 1)."""
    tau, run = 1.0, 1.0
    for acc in position_accuracies:
        run *= acc
        tau += run
    return tau


class LogWindow:
    """The loss, metrics and real tokens of the optimizer steps since the last metrics row,
    summed on the device: a step adds tensors and reads nothing; `read` reduces them over the
    processes and reads the host once (with the stop-signal counts folded in).

    Args:
        accelerator: the run's Accelerator.
        step: the optimizer steps done before the window's first.
    """

    def __init__(self, accelerator, step: int):
        self.accelerator, self.first_step = accelerator, step + 1
        self.names: list[str] = []
        self.sums: torch.Tensor | None = None  # (1 + metrics,) float64: loss, metrics
        self.tokens: torch.Tensor | None = None  # () real tokens of the window's micro-steps
        self.steps = 0

    def add_tokens(self, attention_mask: torch.Tensor) -> None:
        """A micro-step's real tokens (1s of its (B, T) attention mask)."""
        count = attention_mask.sum()
        self.tokens = count if self.tokens is None else self.tokens + count

    def add_step(self, loss: torch.Tensor, metrics: dict) -> None:
        """An optimizer step's loss and metrics (scalars: tensors or floats)."""
        if self.sums is None:
            self.names = sorted(metrics)
        values = torch.stack([loss.detach().reshape(()).double(), *(
            torch.as_tensor(metrics[k], device=loss.device).detach().reshape(()).double()
            for k in self.names)])
        self.sums = values if self.sums is None else self.sums + values
        self.steps += 1

    def read(self, stop_counts: tuple[int, int]) -> tuple[float, dict, int, list[float]]:
        """The window's means (loss, metrics: over its steps and the processes), real tokens
        (summed over processes) and `stop_counts` summed over processes, from one host read;
        then the window starts again after its last step. The means equal one process's run on
        the whole batch when the processes' shares weigh the same (equal trained-token counts).
        """
        accelerator = self.accelerator
        device = self.sums.device
        local = torch.cat([self.sums, self.tokens.reshape(1).to(device, torch.float64),
                           torch.tensor(stop_counts, dtype=torch.float64, device=device)])
        if accelerator.num_processes > 1:
            local = accelerator.reduce(local, "sum")
        values = local.tolist()  # the window's one read of the device
        shares = self.steps * accelerator.num_processes
        loss, *metrics = (v / shares for v in values[:len(self.names) + 1])
        tokens, stops = int(values[len(self.names) + 1]), values[len(self.names) + 2:]
        self.first_step += self.steps
        self.sums, self.tokens, self.steps = None, None, 0
        return loss, dict(zip(self.names, metrics, strict=True)), tokens, stops


class MetricsLog:
    """Appends one JSON object per line to `path` on the main process; mirrors to trackers."""

    def __init__(self, path: Path, accelerator):
        self.path = path
        self.accelerator = accelerator
        if accelerator.is_main_process:
            path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps after `step` (a run resumed from a checkpoint at `step` writes them
        again, so each step has one row) and a half-written last line (a run killed while
        writing it), saying so.

        Raises:
            DraftsmithError: any other line is not a JSON object with a numeric step.
        """
        if not self.accelerator.is_main_process or not self.path.is_file():
            return
        keep = [line for line, row in metrics_rows(self.path, self.accelerator.print)
                if row.get("step", 0) <= step]
        write_atomic(self.path, lambda tmp: tmp.write_text("".join(f"{k}\n" for k in keep)))

    def write(self, row: dict) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(row) + "\n")
        self.accelerator.log({k: v for k, v in row.items() if k != "step"}, step=row.get("step"))


def metrics_rows(path: Path, note=print) -> list[tuple[str, dict]]:
    """Each row of a `metrics.jsonl` with its line; a half-written last line (a run killed while
    writing it) is dropped with a note.

    Raises:
        DraftsmithError: any other line is not a JSON object with a numeric step.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = _json_object(line)
        if row is None and number == len(lines) and not text.endswith("\n"):
            note(f"{path}: dropped its half-written last line (a run was killed while writing it)")
            continue
        if row is None or not isinstance(row.get("step", 0), (int, float)):
            raise DraftsmithError(
                f"{path}:{number} is not a metrics row ({line[:80]!r}); the log is damaged: "
                "delete that line, or the whole file (it is only a log; the training state is in "
                "the checkpoints), and run again")
        rows.append((line, row))
    return rows


def _json_object(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None
