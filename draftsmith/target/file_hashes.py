"""sha256 of a file, remembered per (size, mtime, ctime, inode) in this process and in a JSON record
file, so verifying an unchanged multi-gigabyte model on each load costs a stat, not a read."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from draftsmith.files import read_json_dict, sha256_file

STAMP = ("size", "mtime_ns", "ctime_ns", "inode")
# a hash taken within this long of the file's last change is not kept: inode times tick with a
# coarse clock (a jiffy, FAT's 2 s), so a write in the same tick would leave the stamp as it was
RACY_NS = 2_000_000_000
_hashed: dict[str, tuple] = {}  # resolved path -> (*stamp, sha256)


def file_stamp(stat: os.stat_result) -> tuple[int, int, int, int]:
    """What a file's hash is reused under: size, mtime, and the inode's ctime and number. A write
    changes the ctime even when the mtime is put back (`os.utime`), and the ctime cannot be set."""
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino


def sha256_cached(path: Path, record_path: Path) -> str:
    """sha256 of a file, computed once per (path, `file_stamp`) and remembered in this process and
    in the JSON file `record_path` (a file written since has a new stamp and is rehashed)."""
    key = str(Path(path).resolve())
    stamp = file_stamp(os.stat(key))
    if key in _hashed and _hashed[key][:-1] == stamp:
        return _hashed[key][-1]
    records = read_json_dict(record_path)
    entry = records.get(key)
    if isinstance(entry, dict) and tuple(entry.get(k) for k in STAMP) == stamp:
        digest = str(entry.get("sha256"))
    else:
        digest = sha256_file(Path(key))
        if time.time_ns() - max(stamp[1], stamp[2]) < RACY_NS:
            return digest  # changed just now: hashed again next time, as git does a racy file
        records[key] = {**dict(zip(STAMP, stamp, strict=True)), "sha256": digest}
        try:
            record_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = record_path.with_name(f".{record_path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(records, indent=1) + "\n")
            tmp.replace(record_path)
        except OSError:  # a read-only cache only costs a rehash next time
            pass
    _hashed[key] = (*stamp, digest)
    return digest
