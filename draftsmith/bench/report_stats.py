"""The numbers BENCHMARKS.md is made of, read from a bench.json payload: means over the prompt
sets (each set weighted equally, as the bars are stated), acceptance per depth, drafting share,
time per decode round, display names."""

from __future__ import annotations

import statistics
from pathlib import Path

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


def method_names(bench: dict) -> dict:
    """Each method's display name: the config's, plain decoding's own, and for a pass's method
    the config has no name for, the name of the same method with another drafter of that kind
    plus this drafter's label (`DFlash (block chain) [dflash8k]`)."""
    cfg = bench["config"]
    names = {"plain": "plain decoding", **cfg["eval"]["methods"]}
    kinds = {k["label"]: (k.get("drafter") or {}).get("kind") or _recipe_kind(k.get("recipe"))
             for k in cfg.get("kinds") or []}
    for spec in (cfg["eval"].get("passes") or {}).values():
        for method in spec.get("methods") or []:
            base, _, label = method.partition("@")
            if method in names or not label:
                continue
            for named, name in list(names.items()):
                other_base, _, other = named.partition("@")
                if other_base == base and other and kinds.get(other) == kinds.get(label):
                    names[method] = f"{name} [{label}]"
                    break
    return names


def _recipe_kind(recipe: str | None) -> str | None:
    """The drafter kind a recipe file names (None when it cannot be read)."""
    import yaml

    try:
        return (yaml.safe_load(Path(recipe).read_text()).get("drafter") or {}).get("kind")
    except (OSError, TypeError, AttributeError, yaml.YAMLError):
        return None
