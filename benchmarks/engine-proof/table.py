"""Regenerate the engine-support table from the registry and the committed proofs:

    .venv/bin/python benchmarks/engine-proof/table.py

reads `results.json` beside this file (written by prove.py), writes the proofs the model cards
cite into `draftsmith/export/engine_proofs.py` and the table into README.md between its
`<!-- table -->` markers (`draftsmith.export.engine_support` builds it)."""

from __future__ import annotations

import json
import pprint
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROOFS_MODULE = ROOT / "draftsmith" / "export" / "engine_proofs.py"
START, END = "<!-- table -->", "<!-- /table -->"


def proofs_from(results: dict) -> dict:
    """(format, kind, engine, engine version) -> the pair rows, as the cards cite them."""
    proofs: dict = {}
    for row in results.get("pairs", []):
        key = (row["format"], row["kind"], row["engine"], row.get("engine_version"))
        proofs.setdefault(key, []).append({
            "drafter": row["drafter"], "passed": row["passed"],
            "engine": row.get("acceptance_per_position_engine"),
            "loop": row.get("acceptance_per_position_loop"),
            "prompts": row["prompts"], **({"error": row["error"]} if "error" in row else {})})
    return proofs


def write_proofs_module(proofs: dict, results: dict) -> bool:
    """Write the proofs module, unless it already holds these proofs (an unchanged module keeps
    the date and commit of the run that proved them); returns whether it wrote."""
    from draftsmith.export.engine_proofs import PROOFS

    if proofs == PROOFS:
        return False
    text = (f'"""Engine proofs the model cards cite: written by benchmarks/engine-proof/table.py '
            f'from\nbenchmarks/engine-proof/results.json ({results.get("date")}, commit '
            f'{results.get("commit")}); do not edit by hand."""\n\n'
            f"PROOFS = {pprint.pformat(proofs, width=96, sort_dicts=True)}\n")
    PROOFS_MODULE.write_text(text)
    return True


def pct(rates) -> str:
    return " / ".join(f"{r:.1%}" for r in rates) if rates else "-"


def results_table(rows: list[dict]) -> str:
    """One line per pair: the verdict and the acceptance per draft position."""
    lines = ["| export | engine | passed | engine accepts at 1 / 2 / 3 | loop | prompts compared | "
             "middling at 1 | identical to plain |", "|---" * 8 + "|"]
    for r in rows:
        where = f"{r['engine_name']} {r['engine_version']}" if r.get("engine_version") else \
            r["engine"]
        if "error" in r:
            lines.append(f"| {r['name']} | {where} | {verdict(r)} | {r['error']} | | | | |")
            continue
        cells = [r["name"], where, verdict(r), pct(r["acceptance_per_position_engine"]),
                 pct(r["acceptance_per_position_loop"]),
                 f"{r['prompts_compared']}/{r['prompts']}", "yes" if r["middling"] else "no",
                 f"{r['identical'][0]}/{r['identical'][1]} ({r['near_ties']} near-ties)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(row: dict) -> str:
    if row.get("refused"):
        return "refused"
    return "yes" if row["passed"] else "**no**"


def served(row: dict) -> str:
    """A row's acceptance in the engine against the loop's, or why there is none."""
    if row.get("refused") or row.get("error"):
        return row.get("refused") or row["error"]
    return (f"{pct(row['acceptance_per_position_engine'])} vs loop "
            f"{pct(row['acceptance_per_position_loop'])} (gap {100 * row['max_gap']:.1f} points)")


def old_table(rows: list[dict]) -> str:
    """One line per old export beside its fixed twin: the same drafter as draftsmith exports it
    now (or refuses to)."""
    lines = ["| case | what the old export did | old export passes | old: engine vs loop at "
             "1 / 2 / 3 | fixed export passes | fixed: engine vs loop |", "|---" * 6 + "|"]
    for r in rows:
        fixed = r.get("fixed_export") or {}
        lines.append(f"| {r['name']} ({r['drafter']}) | {r['old_export']} | {verdict(r)} | "
                     f"{served(r)} | {verdict(fixed) if fixed else '-'} | "
                     f"{served(fixed) if fixed else 'not run'} |")
    return "\n".join(lines)


def replace_between(text: str, start: str, end: str, body: str) -> str:
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def main() -> int:
    from draftsmith.export.engine_support import markdown_table

    results = json.loads((HERE / "results.json").read_text())
    proofs = proofs_from(results)
    wrote = write_proofs_module(proofs, results)
    readme = HERE / "README.md"
    text = replace_between(readme.read_text(), START, END, markdown_table(proofs))
    text = replace_between(text, "<!-- pairs -->", "<!-- /pairs -->",
                           results_table(results.get("pairs", [])))
    text = replace_between(text, "<!-- old -->", "<!-- /old -->",
                           old_table(results.get("old_exports", [])))
    readme.write_text(text)
    print(f"wrote the table in {readme.relative_to(ROOT)}; {PROOFS_MODULE.relative_to(ROOT)} "
          + ("rewritten" if wrote else "unchanged (the same proofs)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
