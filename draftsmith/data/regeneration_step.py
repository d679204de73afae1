"""The data pipeline's regeneration step: the target answers the conversations again
(`regenerate.py`), through its own process or a server opened only when a shard still needs
answering; the step reports what it kept, skipped and failed, and hands rendering the
regenerated conversations (plus those past `data.regenerate.limit` or the budget, as written).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from draftsmith.data.conversations import Conversation
from draftsmith.data.data_run import DataRun
from draftsmith.data.regenerate import RegenerationReport, regenerate
from draftsmith.data.regeneration_server import open_regeneration_server
from draftsmith.data.shards import budget_line, read_manifest, shard_seconds, throughput
from draftsmith.data.sources import load_conversations
from draftsmith.files import read_json_dict

SHOWN_FAILURES = 10  # failed conversations listed in the log (summary.json lists every one)


def regeneration_step(run: DataRun, conversations: list[Conversation],
                      ) -> tuple[dict, list[Conversation] | None]:
    """Regenerate `conversations` into `out_dir/regenerated/`, resuming a previous run.

    Returns:
        the summary's `regeneration` section, and the conversations rendering reads next (the
        regenerated ones, then those kept as written); None while the step is unfinished (a
        later run resumes it).
    """
    settings = run.data.regenerate
    folder = run.out_dir / "regenerated"
    report, served = _regenerate(run, conversations[:settings.limit], folder)
    manifest = read_manifest(folder)
    covered = sum(s["count"] for s in manifest["shards"])
    kept = conversations[covered:] if report.complete else []
    section = _section(report, manifest, folder, settings.backend,
                       served or _previous_server(run.out_dir), len(kept))
    _log_counts(section, run.out_dir, run.log)
    if settings.max_minutes is not None:
        run.log(budget_line("data.regenerate.max_minutes", shard_seconds(manifest),
                            settings.max_minutes))
    if not report.complete:
        run.log(f"stopped after {report.shards_written} new shard(s); run again to resume")
        return section, None
    regenerated = load_conversations(str(folder))[0] + kept
    if kept:
        why = ("data.regenerate.max_minutes reached" if report.budget_reached
               else "data.regenerate.limit")
        run.log(f"{len(kept):,} more conversations keep their responses as written ({why})")
    return section, regenerated


def _regenerate(run: DataRun, conversations: list[Conversation], folder: Path,
                ) -> tuple[RegenerationReport, dict]:
    """Run `regenerate` with the recipe's backend. An `openai` backend's server is opened only
    when a shard still needs answering, and closed after the last; its record is the second
    value (empty when none was opened)."""
    data, target = run.data, run.target
    served: dict = {}
    with ExitStack() as stack:
        def connect():
            server, record = stack.enter_context(open_regeneration_server(
                data.regenerate, run.recipe.target.name, target.model, target.tokenizer,
                run.template, data.max_length, run.log, log_path=folder / "server.log"))
            served.update(record)
            return server

        report = regenerate(
            target.model, target.tokenizer, conversations, folder, template=run.template,
            settings=data.regenerate, max_length=data.max_length,
            eos_ids=target.eos_token_ids, identity=run.identity,
            stop_after_shards=run.stop_after_shards, progress=run.progress,
            server=connect if data.regenerate.backend == "openai" else None)
    return report, served


def _section(report: RegenerationReport, manifest: dict, folder: Path, backend: str,
             server: dict | None, kept: int) -> dict:
    """The summary's `regeneration` section, counted over every finished shard (every run's)."""
    shards = manifest["shards"]
    covered = sum(s["count"] for s in shards)
    failed = [f for s in shards for f in s.get("failed", [])]
    written = sum(s["written"] for s in shards)
    return {
        "folder": str(folder), "complete": report.complete, "backend": backend,
        "server": server,
        "shards": f"{report.shards_written + report.shards_skipped}/{report.shards_total}",
        "input": covered, "conversations": written, "failed": failed,
        "skipped": covered - written - len(failed),
        "new_tokens": throughput(manifest, "new_tokens"),
        "stops": dict(sum((Counter(s["stops"]) for s in shards), Counter())),
        "dropped": dict(sum((Counter(s["dropped"]) for s in shards), Counter())),
        "kept_as_written": kept,
        "budget_reached": report.budget_reached,
    }


def _log_counts(section: dict, out_dir: Path, log: Callable[[str], None]) -> None:
    """One line: input = regenerated + failed + skipped, with the reasons; then the first
    failures."""
    written, failed = section["conversations"], section["failed"]
    kept_cut = {why: n for why, n in section["dropped"].items() if "conversation kept" in why}
    skipped = {why: n for why, n in section["dropped"].items() if why not in kept_cut}
    log(f"regenerated {written:,} conversations into {section['folder']} "
        f"({section['new_tokens']['tokens_per_second']} new tokens/s): {section['input']:,} "
        f"input = {written:,} regenerated + {len(failed):,} failed + {section['skipped']:,} "
        "skipped"
        + (f" (skipped: {', '.join(f'{n} {why}' for why, n in skipped.items())})"
           if skipped else "") + "".join(f"; {n} {why}" for why, n in kept_cut.items()))
    for failure in failed[:SHOWN_FAILURES]:
        log(f"  failed: conversation {failure['index']} ({failure['id']}): {failure['error']}")
    if len(failed) > SHOWN_FAILURES:
        log(f"  ... {len(failed) - SHOWN_FAILURES} more failures listed in "
            f"{out_dir / 'summary.json'}")


def _previous_server(out_dir: Path) -> dict | None:
    """The server record of the run that answered the shards (a finished run starts none)."""
    previous = read_json_dict(out_dir / "summary.json") or {}
    return (previous.get("regeneration") or {}).get("server") or None
