"""Atomic shard files and the JSON manifest that makes sharded runs resumable.

A run (regeneration or a hidden-state cache) plans its shards up front from its inputs, writes
each shard to a temporary file renamed into place, then records it in `manifest.json`, itself
replaced atomically. After a kill, a shard is either recorded (complete, skipped on resume) or
not (redone and overwritten), so nothing is lost or duplicated. A manifest also pins the settings
the run was started with; resuming with different settings is refused.

`ShardReport` is the bookkeeping both runs share: which shards are still to write, when a
wall-clock budget (`max_minutes`, summed over runs) closes the run, and what one call did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.files import write_json

MANIFEST = "manifest.json"
RECENT_SHARDS = 4  # the next shard's duration is estimated from this many latest finished shards


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, or None when there is none.

    Raises:
        DraftsmithError: the manifest is not valid JSON or not a JSON object (a damaged file:
            the run's shards cannot be trusted, so the message says to start over).
    """
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    fix = f"delete {folder} and run `draftsmith data run` again to rebuild it"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise DraftsmithError(f"{path} is damaged (not valid JSON: {err}); {fix}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise DraftsmithError(f"{path} is damaged (not a draftsmith manifest with a shard list); "
                              f"{fix}")
    return manifest


def _normalized(value):
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def open_run(folder: Path, kind: str, settings: dict, extra: dict | None = None) -> dict:
    """The manifest to continue: the existing one when its settings match, else a new empty one.

    Args:
        folder: the run's folder (created if needed).
        kind: what the run writes (`regenerated`, `feature_cache`); a folder of another kind is refused.
        settings: everything that determines the shards' content; must equal the stored settings.
        extra: fields stored in a new manifest beside the settings.

    Raises:
        DraftsmithError: the folder holds a run of another kind or with other settings (the
            message lists the differing keys and says to pick another folder or delete it).
    """
    folder = Path(folder)
    settings = _normalized(settings)
    existing = read_manifest(folder)
    if existing is None:
        manifest = {"kind": kind, "settings": settings, **(extra or {}), "shards": []}
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / MANIFEST, manifest)
        return manifest
    fix = f"choose another output folder, or delete {folder} to start over"
    if existing.get("kind") != kind:
        raise DraftsmithError(
            f"{folder} holds a {existing.get('kind')!r} run, not a {kind!r} one; {fix}"
        )
    old = existing.get("settings", {})
    differing = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
    if differing:
        details = "; ".join(f"{k}: {old.get(k)!r} then, {settings.get(k)!r} now" for k in differing)
        raise DraftsmithError(
            f"{folder} holds a run started with other settings ({details}); resuming would mix "
            f"them; {fix}"
        )
    return existing


def check_run_target(folder: Path, target: dict) -> None:
    """Refuse early when `folder` holds a run made with another target (before anything else of
    the pipeline is rewritten for the new one).

    Raises:
        DraftsmithError: the stored run's `settings.target` differs from `target`.
    """
    existing = read_manifest(Path(folder))
    old = (existing or {}).get("settings", {}).get("target")
    if old is not None and old != _normalized(target):
        raise DraftsmithError(
            f"{folder} was made with another target ({old}), not this one ({_normalized(target)}); "
            f"choose another data.out_dir, or delete {folder} to start over")


def done_shards(manifest: dict) -> set[int]:
    """Indices of the shards already written whole (a shard a budget cut, `partial`, is written
    again whole by a run with room left)."""
    return {shard["index"] for shard in manifest["shards"] if not shard.get("partial")}


def record_shard(folder: Path, manifest: dict, entry: dict) -> None:
    """Add a written shard (`entry["index"]` and its file) to the manifest and save it atomically."""
    manifest["shards"] = sorted(
        [s for s in manifest["shards"] if s["index"] != entry["index"]] + [entry],
        key=lambda s: s["index"],
    )
    write_json(Path(folder) / MANIFEST, manifest)


def rank_record(folder: Path, rank: int) -> Path:
    """Where process `rank` of a run shared by several records the shards it wrote (rank 0
    folds these into the manifest, `merge_rank_records`: one writer per file)."""
    return Path(folder) / f"manifest.rank-{rank}.json"


def merge_rank_records(folder: Path, manifest: dict) -> int:
    """Fold the shards other processes recorded (`rank_record`) into the manifest, save it and
    delete those records. A recorded shard counts only when its file is on disk with the size it
    was recorded with (a record written before a kill is redone otherwise). Returns how many
    shards were added.

    Raises:
        DraftsmithError: a record that is not valid JSON (the message names it).
    """
    added = 0
    for path in sorted(Path(folder).glob("manifest.rank-*.json")):
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))["shards"]
        except (ValueError, KeyError, TypeError) as err:
            raise DraftsmithError(f"{path} is damaged ({err}); delete it (its shards are "
                                  "redone) and run `draftsmith data run` again") from None
        for entry in entries:
            shard = Path(folder) / entry["file"]
            if shard.is_file() and shard.stat().st_size == entry["bytes"]:
                manifest["shards"] = [s for s in manifest["shards"]
                                      if s["index"] != entry["index"]] + [entry]
                added += 1
    manifest["shards"].sort(key=lambda s: s["index"])
    write_json(Path(folder) / MANIFEST, manifest)
    for path in Path(folder).glob("manifest.rank-*.json"):
        path.unlink()
    return added


def next_shard_seconds(manifest: dict, size: int, size_key: str) -> float | None:
    """How long a shard of `size` work units (`size_key` of a manifest entry: conversations,
    tokens) should take: the mean time of the latest finished shards, or proportionally less for
    a smaller shard (shards are planned to one size; the last one is often smaller). None before
    the first shard finished."""
    recent = manifest["shards"][-RECENT_SHARDS:]  # shards are written in index order
    if not recent:
        return None
    seconds = sum(s["seconds"] for s in recent) / len(recent)
    typical = sum(s[size_key] for s in recent) / len(recent)
    return seconds * min(1.0, size / typical) if typical > 0 else seconds


def budget_has_room(manifest: dict, max_minutes: float | None, size: int, size_key: str) -> bool:
    """Whether a run with a budget of `max_minutes` (None: none) starts its next shard.

    It does unless the finished shards (summed over runs) took the budget, or the next shard,
    at the latest shards' pace (`next_shard_seconds`), would end more than half of itself past
    the budget: so the run ends within half a shard of its budget, on either side.
    """
    if max_minutes is None:
        return True
    budget = max_minutes * 60
    spent = shard_seconds(manifest)
    estimate = next_shard_seconds(manifest, size, size_key)
    return spent < budget and (estimate is None or spent + estimate / 2 <= budget)


def budget_line(setting: str, seconds: float, max_minutes: float) -> str:
    """How a phase spent its wall-clock budget, for the log: `data.cache.max_minutes=3: 2:58
    spent (-1% of the budget)`."""
    budget = max_minutes * 60
    return (f"{setting}={max_minutes:g}: {int(seconds // 60)}:{int(seconds % 60):02d} spent "
            f"({(seconds - budget) / budget:+.0%} of the budget)")


def shard_seconds(manifest: dict) -> float:
    """Seconds the finished shards of a run took, summed over its runs (what its budget counts)."""
    return sum(s["seconds"] for s in manifest["shards"])


def throughput(manifest: dict, tokens_key: str) -> dict:
    """The run's tokens (`tokens_key` of each shard), seconds and tokens per second, summed over
    its finished shards, for a summary."""
    tokens = sum(s[tokens_key] for s in manifest["shards"])
    seconds = shard_seconds(manifest)
    return {"tokens": tokens, "seconds": round(seconds, 2),
            "tokens_per_second": round(tokens / seconds, 1) if seconds else None}


@dataclass
class ShardReport:
    """What one call of a sharded run did (this call only; earlier finished shards are skipped).

    Attributes:
        folder: the run's folder.
        shards_total: shards the run is planned in.
        shards_written, shards_skipped: written by this call; finished by an earlier one.
        tokens: tokens this call processed (regeneration: generated; the cache: read).
        seconds: time this call spent writing shards.
        budget_reached: `max_minutes` closed the run before its last shard.
    """

    folder: Path
    shards_total: int
    shards_written: int = 0
    shards_skipped: int = 0
    tokens: int = 0
    seconds: float = 0.0
    budget_reached: bool = False

    @classmethod
    def start(cls, folder: Path, manifest: dict, shards_total: int):
        """The report of a call that continues the run `manifest` records."""
        done = done_shards(manifest) & set(range(shards_total))
        return cls(Path(folder), shards_total, shards_skipped=len(done))

    @property
    def complete(self) -> bool:
        return self.budget_reached or self.shards_written + self.shards_skipped == self.shards_total

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    def pending(self, manifest: dict, sizes: Sequence[int], size_key: str,
                max_minutes: float | None, stop_after_shards: int | None,
                owns: Callable[[int], bool] | None = None) -> Iterator[int]:
        """The indices of the shards still to write, in order (count each with `wrote`).

        Args:
            manifest: the run's manifest (finished shards are skipped).
            sizes: each planned shard's work units, as `size_key` records them.
            size_key: the manifest entries' field of work units (`count`, `tokens`).
            max_minutes: the budget (`budget_has_room`); stopping for it sets `budget_reached`.
            stop_after_shards: stop after this many new shards (None: no limit).
            owns: which shard indices this process writes (several processes share a run);
                None = all.
        """
        done = done_shards(manifest)
        for index, size in enumerate(sizes):
            if index in done or (owns is not None and not owns(index)):
                continue
            if stop_after_shards is not None and self.shards_written >= stop_after_shards:
                return
            if not budget_has_room(manifest, max_minutes, size, size_key):
                self.budget_reached = True
                return
            yield index

    def wrote(self, seconds: float, tokens: int) -> None:
        """Count a shard this call wrote."""
        self.shards_written += 1
        self.seconds += seconds
        self.tokens += tokens
