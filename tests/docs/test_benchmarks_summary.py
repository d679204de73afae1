"""BENCHMARKS.md opens with the summary across runs (issue 56), and that table is what
`bench.report.summary_section` makes of the committed benchmarks/*/bench.json: a regenerated
file keeps it, and the committed one was not edited by hand."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.bench.report import bench_name, summary_section

ROOT = Path(__file__).resolve().parents[2]


def _benches_in_file_order(text: str) -> list[dict]:
    benches = [json.loads(p.read_text()) for p in sorted(ROOT.glob("benchmarks/*/bench.json"))]

    def position(bench: dict) -> int:
        cfg = bench["config"]
        name = bench_name(cfg)
        heading = f"## {cfg['target']}" + (f" ({name})" if name != cfg["target"] else "") + "\n"
        return text.index(heading)
    return sorted(benches, key=position)


def test_the_first_table_is_the_summary_across_runs():
    text = (ROOT / "BENCHMARKS.md").read_text()
    first_table = next(line for line in text.splitlines() if line.startswith("|"))
    assert first_table.startswith("| target | drafter | best method | tau | speedup | vs prompt")
    expected = summary_section(_benches_in_file_order(text))
    assert "\n".join(expected) in text


def test_every_row_links_to_a_run_section():
    text = (ROOT / "BENCHMARKS.md").read_text()
    rows = [line for line in summary_section(_benches_in_file_order(text))
            if line.startswith("| `")]
    assert rows
    headings = {line[3:] for line in text.splitlines() if line.startswith("## ")}
    for row in rows:
        title = row.rsplit("[", 1)[1].split("]")[0]
        assert title in headings, f"{title} is no section of BENCHMARKS.md"
