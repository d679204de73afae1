"""The benchmark reads its results only through the typed reader (issue 51): eval.json,
bench.json and each drafter's budget.json go through `draftsmith.eval.results`, so a renamed or missing field is one clear error
when the file is read, not a KeyError deep in BENCHMARKS.md. Every other JSON file the benchmark
reads is listed here with what it is; a new `json.load` in draftsmith/bench fails this test until
it is listed, and a results file cannot be."""

from __future__ import annotations

import ast
from pathlib import Path

import draftsmith

BENCH = Path(draftsmith.__file__).parent / "bench"
RESULTS = ("eval.json", "bench.json", "budget.json")
# (module, function) -> the files its json.load / json.loads calls read, one per call
OTHER_FILES = {
    ("engine_stage.py", "read_engine_checks"): ("serve_check.json",),
    ("engine_stage.py", "_check_one"): ("serve_check.json", "serve_check.json"),
    ("extend.py", "seed_extension"): ("no file: the recipe's JSON round trip",),
    ("report.py", "verify_cost_section"): ("benchmarks/machine*/verify_cost.json",),
    ("report.py", "write_benchmarks"): ("benchmarks/overhead.json",),
    ("run.py", "_train_and_record"): ("train/LABEL/attempts.json", "train/LABEL/extends.json"),
    ("run.py", "_train_seconds"): ("drafter/draftsmith_drafter.json",),
    ("run.py", "_data_record"): ("data/summary.json",),
    ("run.py", "run_bench"): ("data/summary.json",),
}
# reads of a results file in a module this change could not edit: each names the fix, and the
# test fails once the read is gone, so that the entry goes too


def json_reads(source: str) -> dict[tuple[str, ...], int]:
    """(function, ...) -> how many json.load / json.loads calls it makes itself (a call in a
    nested function counts for the innermost one)."""
    found: dict[tuple[str, ...], int] = {}

    def visit(node, scope: tuple[str, ...]):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and \
                    child.func.attr in ("load", "loads") and \
                    isinstance(child.func.value, ast.Name) and child.func.value.id == "json":
                found[scope] = found.get(scope, 0) + 1
            visit(child, scope)

    visit(ast.parse(source), ())
    return found


def test_the_benchmark_reads_results_only_through_the_typed_reader():
    reads = {}
    for path in sorted(BENCH.glob("*.py")):
        text = path.read_text()
        assert "from json import" not in text, f"{path.name}: call json.load(s) by its module"
        for scope, count in json_reads(text).items():
            reads[(path.name, scope[-1] if scope else "<module>")] = count
    listed = OTHER_FILES
    unlisted = {key: n for key, n in reads.items() if len(listed.get(key, ())) != n}
    assert not unlisted, (f"json.load(s) in draftsmith/bench not listed here: {unlisted}; read "
                          "eval.json / bench.json with draftsmith.eval.results.read_eval_results"
                          " / read_bench_results, and list any other file in OTHER_FILES")
    assert not any(name.endswith(RESULTS) for files in OTHER_FILES.values() for name in files)
    gone = [key for key in listed if key not in reads]
    assert not gone, f"listed reads no longer in the code (drop them from this test): {gone}"
    for module in ("run.py", "report.py"):
        assert "from draftsmith.eval.results import" in (BENCH / module).read_text()


def test_the_guard_counts_each_read_in_its_own_function():
    source = ("import json\n"
              "def outer(p):\n"
              "    def inner():\n"
              "        return json.load(open(p))\n"
              "    return json.loads(p.read_text()), json.loads('{}'), inner\n"
              "CONSTANT = json.loads('[]')\n")
    assert json_reads(source) == {("outer", "inner"): 1, ("outer",): 2, (): 1}
