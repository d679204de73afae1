"""Offline model files are checked when loaded: a flipped byte in a catalog GGUF or in the
converted safetensors folder is a clear error, and an unchanged file is hashed once (issue #18)."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.target import file_hashes, offline_models
from draftsmith.target.offline_models import MARKER, OfflineModel
from draftsmith.target.source import resolve_source
from tests.helpers.tiny_targets import tiny_target


def _flip_a_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # coarse clocks too


def _no_hashing(path, *args):
    pytest.fail(f"{path} was hashed again although it did not change")


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A catalog entry `tiny-offline` whose GGUF is 4 KiB of known bytes, in a private cache."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(file_hashes, "_hashed", {})
    monkeypatch.setattr(file_hashes, "RACY_NS", 0)  # files written just now keep their hash
    data = bytes(range(256)) * 16
    model = OfflineModel("tiny-offline", "test-org/tiny", (), "tiny.gguf", len(data),
                         hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(offline_models.CATALOG, model.name, model)
    return model, data


def test_a_flipped_byte_in_a_catalog_gguf_is_refused(tmp_path, fake_model, monkeypatch):
    model, data = fake_model
    copy = tmp_path / "elsewhere" / "model.gguf"  # found by its size
    copy.parent.mkdir()
    copy.write_bytes(data)
    assert resolve_source(str(copy)) == (str(copy.parent), {"gguf_file": "model.gguf"})
    with monkeypatch.context() as patch:
        patch.setattr(file_hashes, "_hashed", {})  # a new process: the record file answers
        patch.setattr(file_hashes, "sha256_file", _no_hashing)
        resolve_source(str(copy))
    _flip_a_byte(copy, 1000)
    with pytest.raises(DraftsmithError, match=r"model.gguf is corrupted: it has the size .* of "
                                              r"tiny-offline's GGUF but not its sha256"):
        resolve_source(str(copy))
    home = offline_models.gguf_path(model.name)  # found by its place, whatever its size
    home.parent.mkdir(parents=True)
    home.write_bytes(data[:-1])
    with pytest.raises(DraftsmithError, match=r"tiny.gguf has 4,095 bytes but tiny-offline should "
                                              r"have 4,096.*models fetch tiny-offline --force"):
        resolve_source(str(home))
    plain = tmp_path / "other.gguf"  # not a catalog file: not checked
    plain.write_bytes(b"GGUF" + bytes(100))
    resolve_source(str(plain))


def test_a_flipped_byte_in_the_converted_folder_is_refused(fake_model, monkeypatch):
    model, _ = fake_model
    folder = offline_models.model_dir(model.name)
    tiny_target("llama").save_pretrained(folder)
    files = {p.name: offline_models.sha256_file(p) for p in sorted(folder.iterdir())}
    (folder / MARKER).write_text(json.dumps({"name": model.name, "files_sha256": files}))
    assert resolve_source(model.name) == (str(folder), {})
    with monkeypatch.context() as patch:
        patch.setattr(file_hashes, "sha256_file", _no_hashing)
        resolve_source(model.name)  # unchanged files: no hashing at all
        patch.setattr(file_hashes, "_hashed", {})
        resolve_source(model.name)  # a new process: the record under the cache answers
    weights = folder / "model.safetensors"
    _flip_a_byte(weights, weights.stat().st_size - 7)
    with pytest.raises(DraftsmithError, match=r"model.safetensors is corrupted: its sha256 differs "
                                              r"from the one recorded .*models fetch tiny-offline "
                                              r"--force"):
        resolve_source(model.name)
    weights.unlink()
    with pytest.raises(DraftsmithError, match=r"model\.safetensors is missing from the converted"):
        resolve_source(model.name)


@pytest.mark.parametrize("who", ["this process", "a new process"])
def test_a_flipped_byte_with_its_mtime_put_back_is_refused(fake_model, monkeypatch, who):
    """A byte flipped in the converted weights, size and mtime kept, passed `generate`: the hash
    was reused by size and mtime. The inode's ctime changes on any write and cannot be set back."""
    model, _ = fake_model
    folder = offline_models.model_dir(model.name)
    tiny_target("llama").save_pretrained(folder)
    files = {p.name: offline_models.sha256_file(p) for p in sorted(folder.iterdir())}
    (folder / MARKER).write_text(json.dumps({"name": model.name, "files_sha256": files}))
    resolve_source(model.name)  # hashed and recorded
    weights = folder / "model.safetensors"
    stat = weights.stat()
    time.sleep(0.05)  # past the coarse clock tick of inode times (RACY_NS covers it when real)
    data = bytearray(weights.read_bytes())
    data[-7] ^= 0xFF
    with open(weights, "r+b") as handle:  # in place: same inode, same size
        handle.write(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (stat.st_size,
                                                                     stat.st_mtime_ns)
    if who == "a new process":
        monkeypatch.setattr(file_hashes, "_hashed", {})
    with pytest.raises(DraftsmithError, match=r"model.safetensors is corrupted"):
        resolve_source(model.name)


def test_a_file_changed_just_now_is_hashed_again_at_its_next_load(tmp_path, monkeypatch):
    """A write in the same tick of the inode clock as the recorded hash would keep the stamp, so a
    hash of a file changed within RACY_NS is not kept (git's racy-file rule)."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(file_hashes, "_hashed", {})
    path = tmp_path / "weights.bin"
    path.write_bytes(b"weights")
    hashed = []
    sha256_file = offline_models.sha256_file
    monkeypatch.setattr(file_hashes, "sha256_file", lambda p: hashed.append(p) or sha256_file(p))
    for _ in range(2):
        file_hashes.sha256_cached(path, offline_models.cache_dir() / offline_models.VERIFIED)
    assert len(hashed) == 2  # written just now: hashed each time
    monkeypatch.setattr(file_hashes, "RACY_NS", 0)
    for _ in range(2):
        file_hashes.sha256_cached(path, offline_models.cache_dir() / offline_models.VERIFIED)
    assert len(hashed) == 3  # settled: hashed once, then reused
