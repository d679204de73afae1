"""Training metrics: a local JSONL file written by rank 0 (and accelerate trackers), and the
simulated acceptance length from per-position accuracies."""

from __future__ import annotations

import json
from pathlib import Path

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


class MetricsLog:
    """Appends one JSON object per line to `path` on the main process; mirrors to trackers."""

    def __init__(self, path: Path, accelerator):
        self.path = path
        self.accelerator = accelerator
        if accelerator.is_main_process:
            path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps after `step` (a run resumed from a checkpoint at `step` writes them
        again, so each step has one row)."""
        if not self.accelerator.is_main_process or not self.path.is_file():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        write_atomic(self.path, lambda tmp: tmp.write_text("".join(f"{k}\n" for k in keep)))

    def write(self, row: dict) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(row) + "\n")
        self.accelerator.log({k: v for k, v in row.items() if k != "step"}, step=row.get("step"))
