"""Atomic file writes: a file is either absent or complete, never half-written (a crash or a kill
leaves at most a hidden temporary file next to it); a write that fails for want of disk space
says so and where (`disk_space_errors`), whichever library wrote."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from draftsmith.errors import DraftsmithError

# a short write leaves at most this much free: torch's zip writer then reports "unexpected pos"
LOW_SPACE_BYTES = 1 << 20
OUTPUT_HINT = ("set the output folder (train.output_dir, data.out_dir, --out) to a disk with room")


def disk_full(err: BaseException, folder: Path | None = None) -> bool:
    """True when `err` is a write failing for want of space: ENOSPC or EDQUOT, a library's message
    of it (safetensors: "No space left on device (os error 28)"), or an I/O error (torch's zip
    writer: "unexpected pos") while `folder`'s disk has less than LOW_SPACE_BYTES free."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    if "No space left on device" in text or "os error 28" in text or "quota exceeded" in text:
        return True
    if folder is None or not isinstance(err, (OSError, RuntimeError)):
        return False
    try:
        return shutil.disk_usage(existing_parent(folder)).free < LOW_SPACE_BYTES
    except OSError:
        return False


def existing_parent(path: Path) -> Path:
    """`path` or its nearest existing parent folder."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def no_space_message(path: str | Path, hint: str = OUTPUT_HINT) -> str:
    """`no space left on device at PATH (N MB free): free space there or HINT`."""
    try:
        free = f"{shutil.disk_usage(existing_parent(Path(path))).free / 1e6:,.1f} MB free"
    except OSError:
        free = "free space unknown"
    return f"no space left on device at {path} ({free}): free space there or {hint}"


def disk_full_report(err: BaseException) -> str | None:
    """The one-line error for a command that ended in `err`, when it is a full disk (None
    otherwise): where the failed write was, when the error names it."""
    if not disk_full(err):
        return None
    where = getattr(err, "filename", None)
    if where:
        return no_space_message(where)
    return f"no space left on device while writing ({err}): free space on its disk or {OUTPUT_HINT}"


@contextlib.contextmanager
def disk_space_errors(path: str | Path, hint: str = OUTPUT_HINT) -> Iterator[None]:
    """Turn a write inside the block that failed for want of space (`disk_full`) into a
    DraftsmithError naming `path` and the fix; any other error passes unchanged."""
    try:
        yield
    except DraftsmithError:
        raise
    except Exception as err:
        if disk_full(err, Path(path).parent):
            raise DraftsmithError(no_space_message(path, hint)) from err
        raise


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` to produce the file, then rename it to `path`.

    Raises:
        DraftsmithError: the disk is full (naming `path`; the temporary file is removed).
    """
    path = Path(path)
    with disk_space_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with disk_space_errors(path):
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
