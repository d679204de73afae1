"""The numbers BENCHMARKS.md is made of, read from a bench.json payload: means over the prompt
sets (each set weighted equally, as the bars are stated), acceptance per depth, drafting share,
time per decode round, display names."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

from draftsmith.eval.methods import Method
from draftsmith.eval.results import BenchResults

SETS_ORDER = ("mt_bench", "humaneval", "gsm8k")


def set_mean(summary: dict, method: str, key: str) -> float | None:
    """Mean of a metric over the prompt sets (not the pooled `all` row)."""
    values = [rows[method][key] for name, rows in summary.items()
              if name != "all" and method in rows and rows[method].get(key) is not None]
    return statistics.fmean(values) if values else None


def depth_rates(summary: dict, method: str, depths: int = 3) -> list[float | None]:
    rates = (summary.get("all", {}).get(method, {}).get("acceptance_by_depth") or [])[:depths]
    return rates + [None] * (depths - len(rates))


def draft_share(summary: dict, method: str) -> float | None:
    """Share of decode time spent drafting (all sets pooled)."""
    split = summary.get("all", {}).get(method, {}).get("time_split") or {}
    return split.get("draft")


def step_ms(row: dict) -> float:
    """Milliseconds per decode round (one target forward), prefill excluded."""
    rounds = row["new_tokens"] / max(row.get("tau") or 1.0, 1e-9)
    return 1e3 * row["seconds"] * (1 - row["time_split"]["prefill"]) / max(rounds, 1e-9)


def method_names(bench: BenchResults) -> dict:
    """Each method's display name: the config's, plain decoding's own, and for a pass's method
    the config has no name for, the name of the same method with another drafter of that kind
    plus this drafter's label (`DFlash (block chain) [dflash8k]`)."""
    cfg = bench.config
    names = {"plain": "plain decoding", **cfg["eval"]["methods"]}
    kinds = {k["label"]: (k.get("drafter") or {}).get("kind") or _recipe_kind(k.get("recipe"))
             for k in cfg.get("kinds") or []}
    for spec in (cfg["eval"].get("passes") or {}).values():
        for method in spec.get("methods") or []:
            parsed = Method.parse(method)
            if method in names or not parsed.label:
                continue
            for named, name in list(names.items()):
                other = Method.parse(named)
                if other.base == parsed.base and other.label and \
                        kinds.get(other.label) == kinds.get(parsed.label):
                    names[method] = f"{name} [{parsed.label}]"
                    break
    return names


def _recipe_kind(recipe: str | None) -> str | None:
    """The drafter kind a recipe file names (None when it cannot be read)."""
    import yaml

    try:
        return (yaml.safe_load(Path(recipe).read_text()).get("drafter") or {}).get("kind")
    except (OSError, TypeError, AttributeError, yaml.YAMLError):
        return None


def _set_mean_speedup(per_prompt: dict, method: str, picks: dict) -> float:
    """Mean over the sets of the method's tokens/s over plain's on the picked prompts."""
    ratios = []
    for set_name, rows in per_prompt.items():
        chosen = picks[set_name]

        def rate(name, rows=rows, chosen=chosen):
            return sum(rows[name][i][0] for i in chosen) / sum(rows[name][i][1] for i in chosen)
        ratios.append(rate(method) / rate("plain"))
    return statistics.fmean(ratios)


def paired_speedup_difference(per_prompt: dict, method: str, other: str, resamples: int = 2000,
                              seed: int = 0) -> tuple[float, float, float] | None:
    """The set-mean speedup of `method` minus `other`'s on the same prompts, and its 95% interval
    by a paired bootstrap (prompts resampled within each set, both methods and plain decoding
    on the same draws), or None where the timings are missing.

    Each speedup is a tokens/s ratio against plain decoding in the same run, as BENCHMARKS.md's
    table states it; resampling prompts shows how much of a difference between two methods the
    prompt sample alone could make.
    """
    sets = {name: rows for name, rows in (per_prompt or {}).items()
            if rows.get("prompts") and all(m in rows for m in (method, other, "plain"))}
    if not sets:
        return None
    everything = {name: range(len(rows["prompts"])) for name, rows in sets.items()}
    point = _set_mean_speedup(sets, method, everything) - _set_mean_speedup(sets, other, everything)
    draw = random.Random(seed)
    diffs = []
    for _ in range(resamples):
        picks = {name: [draw.randrange(len(rows["prompts"])) for _ in rows["prompts"]]
                 for name, rows in sets.items()}
        diffs.append(_set_mean_speedup(sets, method, picks) - _set_mean_speedup(sets, other, picks))
    diffs.sort()
    return point, diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]


def per_prompt_timings(records: list[dict]) -> dict:
    """{set: {"prompts": [[item, turn], ...], method: [[new tokens, seconds], ...]}}: each
    method's timing of the same prompts in the same order, the prompts every method decoded
    (what a paired comparison of two methods' speedups resamples)."""
    by_set: dict[str, dict[tuple, dict]] = {}
    methods = list(dict.fromkeys(r["method"] for r in records))
    for r in records:
        key = (str(r["item_id"]), int(r.get("turn", 0)))
        by_set.setdefault(r["set_name"], {}).setdefault(key, {})[r["method"]] = \
            [r["new_tokens"], r["total_seconds"]]
    table = {}
    for set_name, prompts in sorted(by_set.items()):
        keys = sorted(k for k, done in prompts.items() if len(done) == len(methods))
        table[set_name] = {"prompts": [list(k) for k in keys],
                           **{m: [prompts[k][m] for k in keys] for m in methods}}
    return table
