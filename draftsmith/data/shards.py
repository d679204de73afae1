"""Atomic shard files and the JSON manifest that makes sharded runs resumable.

A run (regeneration or a hidden-state cache) plans its shards up front from its inputs, writes
each shard to a temporary file renamed into place, then records it in `manifest.json`, itself
replaced atomically. After a kill, a shard is either recorded (complete, skipped on resume) or
not (redone and overwritten), so nothing is lost or duplicated. A manifest also pins the settings
the run was started with; resuming with different settings is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.files import write_json

MANIFEST = "manifest.json"


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
    """Indices of the shards already written."""
    return {shard["index"] for shard in manifest["shards"]}


def record_shard(folder: Path, manifest: dict, entry: dict) -> None:
    """Add a written shard (`entry["index"]` and its file) to the manifest and save it atomically."""
    manifest["shards"] = sorted(
        [s for s in manifest["shards"] if s["index"] != entry["index"]] + [entry],
        key=lambda s: s["index"],
    )
    write_json(Path(folder) / MANIFEST, manifest)


def budget_spent(manifest: dict, max_minutes: float | None) -> bool:
    """True when the finished shards of a run took `max_minutes` or more in all (None: never)."""
    spent = sum(s["seconds"] for s in manifest["shards"])
    return max_minutes is not None and spent >= max_minutes * 60
