"""Which serving engine loads which export format, at which version, and how far draftsmith has
proved it: one table built from the format registry (`FORMATS` and the GGUF formats, each
format's `engines` and `not_served_in`), the drafter registry (`engine_methods`) and the committed
engine proofs (`engine_proofs.PROOFS`, written from benchmarks/engine-proof/results.json by
benchmarks/engine-proof/table.py).

A cell says one of:
- `proved here`: served by the engine on this project's machine next to draftsmith's loop on the
  same prompts (`benchmarks/engine-proof/prove.py`): the engine's greedy output equal to its own
  plain decoding, acceptance per draft position within 2 points of the loop's, with a drafter of
  middling acceptance and non-default aux layer ids.
- `failed here`: the same run, not passing (the row in results.json says how).
- `checked against the loader`: the engine cannot run here (SGLang needs a GPU); a test reads
  its released source and checks the architecture and every tensor's name and shape against the
  parameters its model class declares (tests/export/test_sglang_loader_contract.py).
- `loader read`: the loader was read field by field in the engine's released source, nothing
  runs it here.
- `not served`: the engine does not load this format (or this version dropped it).
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.export.record import ExportFormat

PROVED, FAILED, CONTRACT, READ, NOT_SERVED = (
    "proved here", "failed here", "checked against the loader", "loader read", "not served")


@dataclass(frozen=True)
class EngineVersion:
    """One column of the table."""

    engine: str  # registry name: vllm, sglang, llama.cpp
    title: str
    version: str
    runs_here: bool = False

    @property
    def label(self) -> str:
        return f"{self.title} {self.version}"


ENGINE_VERSIONS = (
    EngineVersion("vllm", "vLLM CPU build", "0.32.0", runs_here=True),
    EngineVersion("vllm", "vLLM", "0.33.0"),
    EngineVersion("sglang", "SGLang", "0.5.23"),
    EngineVersion("llama.cpp", "llama.cpp (xllamacpp)", "2026.10.11549", runs_here=True),
)
# (format, engine) -> the test that checks the export against the engine's model class
LOADER_CONTRACTS = {(fmt, "sglang"): "tests/export/test_sglang_loader_contract.py"
                    for fmt in ("eagle", "eagle3", "dflash")}
# P-EAGLE: vLLM's own speculators conversion (`update_peagle`) run on the export
LOADER_CONTRACTS[("peagle-speculators", "vllm")] = "tests/export/test_peagle_export.py"
LOADER_CONTRACTS[("dspark", "sglang")] = "tests/export/test_sglang_dspark_contract.py"


def all_formats() -> list[ExportFormat]:
    """Every export format: the folder layouts, then one GGUF per kind llama.cpp serves."""
    from draftsmith.export.formats import FORMATS
    from draftsmith.export.gguf import gguf_format
    from draftsmith.registry import DRAFTERS

    return [*FORMATS.values(), *(gguf_format(kind) for kind, spec in DRAFTERS.items()
                                 if "llama.cpp" in spec.engine_methods)]


def cell(fmt: ExportFormat, column: EngineVersion, proofs: dict) -> tuple[str, str]:
    """(status, detail) of one format in one engine version; `proofs` maps (format, kind,
    engine, version) to the results rows of that pair (`engine_proofs.PROOFS`)."""
    from draftsmith.registry import get_spec

    if column.engine not in fmt.engines or column.engine not in get_spec(
            fmt.kind).engine_methods:
        return NOT_SERVED, ""
    why = fmt.not_served_in.get(f"{column.engine} {column.version}")
    if why:
        return NOT_SERVED, why
    rows = proofs.get((fmt.name, fmt.kind, column.engine, column.version))
    if rows:
        passed = all(r["passed"] for r in rows)
        detail = "; ".join(
            f"{r['drafter']}: " + ("/".join(f"{a:.0%}" for a in r["engine"]) + " vs loop "
                                   + "/".join(f"{a:.0%}" for a in r["loop"])
                                   if r.get("engine") else r.get("error", "no result"))
            for r in rows)
        return (PROVED if passed else FAILED), detail
    if (fmt.name, column.engine) in LOADER_CONTRACTS:
        return CONTRACT, LOADER_CONTRACTS[(fmt.name, column.engine)]
    return READ, "not run yet" if column.runs_here else ""


def row_label(fmt: ExportFormat) -> str:
    from draftsmith.registry import get_spec

    return f"`{fmt.name}` ({get_spec(fmt.kind).title})"


def markdown_table(proofs: dict) -> str:
    """The whole table: one row per format, one column per engine version."""
    lines = ["| format | " + " | ".join(c.label for c in ENGINE_VERSIONS) + " |",
             "|---|" + "---|" * len(ENGINE_VERSIONS)]
    for fmt in all_formats():
        cells = []
        for column in ENGINE_VERSIONS:
            status, detail = cell(fmt, column, proofs)
            cells.append(status if status == CONTRACT or not detail
                         else f"{status} ({detail})")
        lines.append(f"| {row_label(fmt)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_support(fmt: ExportFormat, settings: dict | None = None,
                   proofs: dict | None = None) -> list[str]:
    """A model card's lines: where its format is served and how far that is proved; an engine
    that would serve another drafter with these drafter `settings` (the registry's
    `unserved_by`, e.g. a DFlash draft vocabulary in SGLang) is not served."""
    from dataclasses import fields

    from draftsmith.registry import get_spec

    if proofs is None:
        from draftsmith.export.engine_proofs import PROOFS as proofs
    spec = get_spec(fmt.kind)
    names = {f.name for f in fields(spec.config_cls)}
    unserved = spec.unserved_by(spec.make_config(
        {k: v for k, v in (settings or {}).items() if k in names}))
    lines = ["| engine | status |", "|---|---|"]
    for column in ENGINE_VERSIONS:
        status, detail = cell(fmt, column, proofs)
        if column.engine in unserved and status != NOT_SERVED:
            status, detail = NOT_SERVED, "this drafter's settings: see its section above"
        lines.append(f"| {column.label} | {status}{f' ({detail})' if detail else ''} |")
    return lines
