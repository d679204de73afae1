"""Atomic file writes: a file is either absent or complete, never half-written (a crash or a kill
leaves at most a hidden temporary file next to it)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` to produce the file, then rename it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json(path: str | Path, payload, indent: int = 2) -> Path:
    """`payload` as JSON (numbers and paths that json does not know become floats / strings)."""
    def default(value):
        return float(value) if hasattr(value, "__float__") else str(value)

    text = json.dumps(payload, indent=indent, default=default) + "\n"
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_json_dict(path: str | Path) -> dict:
    """A JSON object kept as a cache (probe results, verified hashes): {} when the file is
    missing, unreadable or not an object, so a damaged cache only costs its work again."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def sha256_file(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Streaming sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()
