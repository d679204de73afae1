"""The P-EAGLE benchmark's table from one `draftsmith eval` run: per method tau, speedup over plain
decoding, drafting's share of the time, and the draft time per drafting round at the drafted
depth (the bar: P-EAGLE's at most half of EAGLE-3's at the same number of drafted tokens).

    .venv/bin/python benchmarks/peagle/summarize.py EVAL_JSON RESULTS_JSON
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def per_method(records: list[dict]) -> dict[str, dict]:
    """Drafting rounds, their mean drafted depth and draft seconds per round, per method, and the
    same per prompt (for the paired ratio)."""
    rounds, depth, seconds = defaultdict(int), defaultdict(int), defaultdict(float)
    prompt = defaultdict(dict)
    for r in records:
        drafted = [d for d in r["depth_per_step"] if d > 0]
        if not drafted:
            continue
        key = r["method"]
        rounds[key] += len(drafted)
        depth[key] += sum(drafted)
        seconds[key] += r["draft_seconds"]
        prompt[key][(r["set_name"], r["item_id"], r["turn"])] = r["draft_seconds"] / len(drafted)
    return {key: {"drafting_rounds": rounds[key], "mean_drafted_depth": depth[key] / rounds[key],
                  "draft_ms_per_round": 1e3 * seconds[key] / rounds[key],
                  "per_prompt_ms": prompt[key]} for key in rounds}


def main() -> None:
    eval_json, out = Path(sys.argv[1]), Path(sys.argv[2])
    run = json.loads(eval_json.read_text())
    overall = run["summary"]["all"]
    drafting = per_method(run["records"])
    rows = {}
    for method, stats in overall.items():
        row = {"tau": round(stats["tau"], 3), "speedup": round(stats["speedup"], 3),
               "tokens_per_second": round(stats["tokens_per_second"], 2),
               "draft_share": round(stats["time_split"]["draft"], 3),
               "acceptance_by_depth": [round(a, 3) for a in stats["acceptance_by_depth"]]}
        if method in drafting:
            d = drafting[method]
            row.update(drafting_rounds=d["drafting_rounds"],
                       mean_drafted_depth=round(d["mean_drafted_depth"], 2),
                       draft_ms_per_round=round(d["draft_ms_per_round"], 2))
        rows[method] = row
    ratios = {}
    for shape in ("chain", "dynamic"):
        a, b = drafting.get(f"drafter_{shape}@peagle"), drafting.get(f"drafter_{shape}@eagle3")
        if a and b:
            paired = [a["per_prompt_ms"][k] / b["per_prompt_ms"][k]
                      for k in a["per_prompt_ms"] if k in b["per_prompt_ms"]]
            ratios[shape] = {"peagle_over_eagle3_draft_ms_per_round":
                             round(a["draft_ms_per_round"] / b["draft_ms_per_round"], 3),
                             "paired_prompts": len(paired),
                             "median_paired_ratio": round(statistics.median(paired), 3)}
    prompts = len({(r["set_name"], r["item_id"], r["turn"]) for r in run["records"]})
    result = {"eval_json": str(eval_json), "prompts": prompts, "hardware": run["hardware"],
              "date": run["date"], "commit": run["commit"], "methods": rows,
              "draft_time_ratio": ratios}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"methods": rows, "draft_time_ratio": ratios}, indent=1))


if __name__ == "__main__":
    main()
