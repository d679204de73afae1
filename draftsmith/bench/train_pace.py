"""The pace of a benchmark's training runs from their metrics rows: a calibration's seconds per
step (scaled to the data's mean batch), and a finished run's seconds per step and tokens per second,
each timed on its own process's clock across resumes."""

from __future__ import annotations

from draftsmith.errors import DraftsmithError


def seconds_per_step(rows: list[dict], step_tokens: float | None = None) -> float:
    """Steady-state seconds per step of a calibration run (its first step excluded), scaled to a
    step of `step_tokens` real tokens (the data's mean) when given: a step costs about in
    proportion to its tokens, and a few calibration batches hold more or fewer than the run's
    average one (6 steps of 4 ShareGPT conversations timed 2.7-3.7 s/step on five samples of the
    same data, so equal budgets got 129-178 steps)."""
    steps = [r for r in rows if "loss" in r]
    if len(steps) < 3:
        raise DraftsmithError("the calibration run logged fewer than 3 steps")
    first, last = steps[1], steps[-1]
    per_step = (last["seconds"] - first["seconds"]) / (last["step"] - first["step"])
    timed = [r.get("tokens") for r in steps[2:]]  # the steps whose durations were measured
    if step_tokens and all(timed):
        per_step *= step_tokens / (sum(timed) / len(timed))
    return per_step


def timed_spans(rows: list[dict]) -> list[list[dict]]:
    """A run's step rows (those with a loss and a time), split where its clock starts over: the
    loop counts `seconds` from each process's own start, so a resumed (or extended) run's rows
    after its checkpoint follow the `resumed` row it writes (or, in logs from before that
    row, the first row whose clock went back)."""
    spans: list[list[dict]] = [[]]
    for row in rows:
        if "resumed" in row:
            spans.append([])
        elif "loss" in row and "seconds" in row:
            if spans[-1] and row["seconds"] < spans[-1][-1]["seconds"]:
                spans.append([])
            spans[-1].append(row)
    return [span for span in spans if span]


def run_seconds_per_step(rows: list[dict]) -> float | None:
    """Mean seconds per step of a run's steps after the first of each process (its held-out
    evaluations and checkpoints included, as the budget counts them), or None for fewer than 2
    steps on one clock."""
    spans = timed_spans(rows)
    steps = sum(span[-1]["step"] - span[0]["step"] for span in spans)
    seconds = sum(span[-1]["seconds"] - span[0]["seconds"] for span in spans)
    return seconds / steps if steps > 0 else None


def tokens_per_second(rows: list[dict]) -> float | None:
    """Real (unpadded) tokens per wall second over a run's steps after the first of each process
    (`timed_spans`), or None for a run logged before steps recorded their tokens. The wall time
    includes what happens between steps (held-out evaluations, checkpoints), as the budget does."""
    spans = timed_spans([r for r in rows if "loss" not in r or "tokens" in r])
    seconds = sum(span[-1]["seconds"] - span[0]["seconds"] for span in spans)
    if seconds <= 0:
        return None
    return sum(r["tokens"] for span in spans for r in span[1:]) / seconds
