"""Per-run records and their aggregation: tau, acceptance per depth, tokens/s, time split, latency."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class RunRecord:
    """One generation (one prompt turn) by one method. Step lists are empty for HF baselines.

    draftsmith's loop takes the first new token from the prefill (`prefill_seconds` holds its
    time), so `tokens_per_step` sums to `new_tokens - 1`; tau and the per-token latencies count
    the steps' tokens only, and the first token's wait is the time to first token."""

    method: str
    set_name: str
    item_id: str
    turn: int
    new_tokens: int
    total_seconds: float
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accepted_per_step: list[int] = field(default_factory=list)
    depth_per_step: list[int] = field(default_factory=list)
    tokens_per_step: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def acceptance_by_depth(accepted: list[int], depths: list[int]) -> list[float]:
    """Conditional acceptance at each draft depth d: P(accepted >= d | reached d-1, drafted d)."""
    if not depths or max(depths) == 0:
        return []
    acc, dep = np.asarray(accepted), np.asarray(depths)
    rates = []
    for d in range(1, int(dep.max()) + 1):
        tried = (acc >= d - 1) & (dep >= d)
        rates.append(float((acc[tried] >= d).mean()) if tried.any() else float("nan"))
    return rates


def summarize(records: list[RunRecord]) -> dict:
    """Aggregate records of one method (over any set of prompts) into a summary dict."""
    tokens = sum(r.new_tokens for r in records)
    seconds = sum(r.total_seconds for r in records)
    steps = sum(len(r.tokens_per_step) for r in records)
    step_tokens = sum(sum(r.tokens_per_step) for r in records)  # the prefill's first tokens aside
    accepted = [a for r in records for a in r.accepted_per_step]
    depths = [d for r in records for d in r.depth_per_step]
    latencies = [s / t for r in records
                 for s, t in zip(r.step_seconds, r.tokens_per_step, strict=True) for _ in range(t)]
    draft = sum(r.draft_seconds for r in records)
    verify = sum(r.verify_seconds for r in records)
    prefill = sum(r.prefill_seconds for r in records)
    # time to first token: the prompt's prefill, which chose it (HF baselines split no prefill)
    first = [r.prefill_seconds for r in records if r.new_tokens and r.prefill_seconds]
    return {
        "runs": len(records),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds else float("nan"),
        "tau": step_tokens / steps if steps else None,
        "acceptance_by_depth": acceptance_by_depth(accepted, depths),
        "time_split": {
            "prefill": prefill / seconds if seconds and steps else None,
            "draft": draft / seconds if seconds and steps else None,
            "verify": verify / seconds if seconds and steps else None,
            "bookkeeping": (seconds - prefill - draft - verify) / seconds if seconds and steps else None,
        },
        "latency_ms_p50": float(np.percentile(latencies, 50)) * 1e3 if latencies else None,
        "latency_ms_p90": float(np.percentile(latencies, 90)) * 1e3 if latencies else None,
        "latency_ms_p99": float(np.percentile(latencies, 99)) * 1e3 if latencies else None,
        "latency_ms_std": float(np.std(latencies)) * 1e3 if latencies else None,
        "ttft_ms_p50": float(np.percentile(first, 50)) * 1e3 if first else None,
        "ttft_ms_p90": float(np.percentile(first, 90)) * 1e3 if first else None,
    }


def summarize_all(records: list[RunRecord], baseline: str = "plain") -> dict:
    """Summaries per set and overall (`"all"`), per method, with speedup against `baseline`."""
    sets = [*sorted({r.set_name for r in records}), "all"]
    methods = list(dict.fromkeys(r.method for r in records))
    table: dict[str, dict[str, dict]] = {}
    for set_name in sets:
        chosen = [r for r in records if set_name in ("all", r.set_name)]
        table[set_name] = {m: summarize([r for r in chosen if r.method == m]) for m in methods}
        base = table[set_name].get(baseline)
        for summary in table[set_name].values():
            summary["speedup"] = (summary["tokens_per_second"] / base["tokens_per_second"]
                                  if base else None)
    return table


def summarize_batch_sizes(overall: dict[str, dict], records, batch_sizes, baseline: str = "plain"
                          ) -> dict[str, dict[str, dict]]:
    """Tokens/s, tau and speedup against `baseline` at the same batch size, per batch size.

    Args:
        overall: batch 1's summaries (`summarize_all(...)["all"]`).
        records: `BatchRecord`s of the batch sizes above 1 (eval/batch_sizes.py).
        batch_sizes: the sizes measured (1 included).
        baseline: the method speedups are against.

    Returns:
        {"B": {method: {tokens_per_second, speedup, tau, new_tokens, seconds, batches, rows}}}
        with batch size keys as strings (JSON).
    """
    curve = {"1": {m: {"tokens_per_second": s["tokens_per_second"], "speedup": s["speedup"],
                       "tau": s["tau"], "new_tokens": s["new_tokens"], "seconds": s["seconds"],
                       "batches": s["runs"], "rows": s["runs"]}
                   for m, s in overall.items()}}
    for size in [b for b in batch_sizes if b > 1]:
        chosen = [r for r in records if r.batch_size == size]
        rows = {}
        for method in dict.fromkeys(r.method for r in chosen):
            mine = [r for r in chosen if r.method == method]
            tokens = sum(r.new_tokens for r in mine)
            seconds = sum(r.total_seconds for r in mine)
            row_steps = sum(r.row_steps for r in mine)
            step_tokens = sum(r.step_tokens for r in mine)
            rows[method] = {"tokens_per_second": tokens / seconds if seconds else float("nan"),
                            "tau": step_tokens / row_steps if row_steps else None,
                            "new_tokens": tokens, "seconds": seconds, "batches": len(mine),
                            "rows": sum(r.rows for r in mine)}
        base = rows.get(baseline)
        for summary in rows.values():
            summary["speedup"] = (summary["tokens_per_second"] / base["tokens_per_second"]
                                  if base else None)
        curve[str(size)] = rows
    return curve
