"""A target folder converted to the GGUF llama.cpp serves is cached by the folder's state and
passes the same sha256 and header checks as a user's GGUF (the converter itself is played here;
the real one runs in tests/serving/test_llama_cpp_gate.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from draftsmith.llama_cpp import convert, target_gguf
from tests.serving.fake_targets import write_tiny_gguf


def test_the_converted_target_is_cached_by_its_folder_and_checked_by_its_sha256(
        tmp_path, tiny_folder, monkeypatch):
    """`--target-outtype`: converted once per folder state; a cached file whose sidecar is gone
    is converted again; the result passes the same sha256 and header checks as a user's GGUF."""
    tiny_folder = Path(shutil.copytree(tiny_folder, tmp_path / "tiny"))  # its files change below

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_convert(model_dir, out, outtype, log=print):  # the real one: the llama.cpp gate
        calls.append((model_dir, outtype))
        write_tiny_gguf(out)
        return out

    monkeypatch.setattr(convert, "convert_model_to_gguf", fake_convert)
    first = target_gguf.converted_target_gguf(tiny_folder, "f32", lambda _: None)
    assert first.name == f"{tiny_folder.name}-f32.gguf" and len(calls) == 1
    assert target_gguf.converted_target_gguf(tiny_folder, "f32", lambda _: None) == first
    assert len(calls) == 1, "a cached conversion with its sha256 is reused"
    first.with_name(first.name + ".sha256").unlink()
    assert target_gguf.converted_target_gguf(tiny_folder, "f32", lambda _: None) == first
    assert len(calls) == 2, "without its sha256 the file is converted again"
    record = target_gguf.check_target_gguf(first, str(tiny_folder), tiny_folder, lambda _: None)
    assert record["target_gguf_verified"] == f"sha256 recorded in {first.name}.sha256"
    (tiny_folder / "config.json").write_text((tiny_folder / "config.json").read_text() + " ")
    changed = target_gguf.converted_target_gguf(tiny_folder, "f32", lambda _: None)
    assert changed != first and len(calls) == 3, "another folder state, another conversion"
