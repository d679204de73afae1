"""`serve-check` checks what the engine will serve before it converts or serves anything: an
offline model's cached GGUF against the catalog's sha256 and its converted folder against the
sha256s recorded at conversion; a user's `--target-gguf` against a `.sha256` beside it and, by its
header, against the target (same architecture, sizes and vocabulary); the Python that
`$DRAFTSMITH_VLLM_PYTHON` / `$DRAFTSMITH_LLAMA_CPP_PYTHON` names. Each refusal is one line with
the fix, and nothing is written to the output folder (issue #18)."""

from __future__ import annotations

import hashlib
import os

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.serving.serve_check_run import check_targets
from draftsmith.target import offline_models
from tests.helpers.cli import assert_refused, run_cli
from tests.serving.fake_targets import fetched_offline_model, write_tiny_gguf


def _flip_a_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # coarse clocks too


@pytest.fixture(autouse=True)
def no_engine_pythons(monkeypatch):
    for variable in ("DRAFTSMITH_VLLM_PYTHON", "DRAFTSMITH_LLAMA_CPP_PYTHON"):
        monkeypatch.delenv(variable, raising=False)




@pytest.fixture
def export_dir(tmp_path):
    """What serve-check's first check accepts as an export folder (the target checks come next)."""
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("Say hello.\n")
    return path


@pytest.fixture
def offline_model(tmp_path, monkeypatch):
    return fetched_offline_model(tmp_path, monkeypatch)


def _serve_check(tmp_path, export_dir, prompt_file, *args):
    out = tmp_path / "out"
    result = run_cli(["serve-check", str(export_dir), "--prompts", str(prompt_file),
                      "--out", str(out), *args])
    return result, out


def test_a_corrupted_cached_gguf_of_an_offline_model_is_refused(tmp_path, offline_model,
                                                               export_dir, prompt_file):
    gguf, folder, record = check_targets(offline_model.name, None, "llama.cpp")
    assert gguf == offline_models.gguf_path(offline_model.name)
    assert folder == offline_models.model_dir(offline_model.name)
    assert record["target_gguf_sha256"] == offline_model.sha256
    assert record["target_gguf_verified"] == "sha256 of tiny-offline in draftsmith's catalog"
    _flip_a_byte(gguf, gguf.stat().st_size - 100)  # in the weights: the header still parses
    result, out = _serve_check(tmp_path, export_dir, prompt_file, "--target", offline_model.name)
    assert_refused(result, f"{gguf} is corrupted", "not its sha256",
                   "run `draftsmith models fetch tiny-offline --force`")
    assert not out.exists()


def test_a_corrupted_converted_folder_of_an_offline_model_is_refused(tmp_path, offline_model,
                                                                    export_dir, prompt_file):
    weights = offline_models.model_dir(offline_model.name) / "model.safetensors"
    _flip_a_byte(weights, weights.stat().st_size - 7)
    result, out = _serve_check(tmp_path, export_dir, prompt_file, "--target", offline_model.name)
    assert_refused(result, "model.safetensors is corrupted",
                   "run `draftsmith models fetch tiny-offline --force`")
    assert not out.exists()


def test_a_missing_cached_gguf_names_the_fetch_command(tmp_path, offline_model, export_dir,
                                                       prompt_file):
    offline_models.gguf_path(offline_model.name).unlink()
    result, _ = _serve_check(tmp_path, export_dir, prompt_file, "--target", offline_model.name)
    assert_refused(result, "tiny.gguf does not exist", "run `draftsmith models fetch tiny-offline`")


def test_a_gguf_of_another_model_is_refused_naming_both(tmp_path, tiny_folder, export_dir,
                                                        prompt_file):
    other = write_tiny_gguf(tmp_path / "other.gguf", arch="qwen2", hidden=64, layers=2, vocab=256)
    result, out = _serve_check(tmp_path, export_dir, prompt_file, "--target", str(tiny_folder),
                               "--target-gguf", str(other))
    assert_refused(result, f"--target {tiny_folder} (llama, hidden size 32, 4 layers, vocab 128)",
                   f"--target-gguf {other} (qwen2, hidden size 64, 2 layers, vocab 256)",
                   "are different models", "architecture llama vs qwen2", "hidden size 32 vs 64",
                   "layers 4 vs 2", "vocab size 128 vs 256")
    assert not out.exists(), "refused before the converter or the engine ran"
    only_vocab = write_tiny_gguf(tmp_path / "vocab.gguf", vocab=200)  # same family and sizes
    result, _ = _serve_check(tmp_path, export_dir, prompt_file, "--target", str(tiny_folder),
                             "--target-gguf", str(only_vocab))
    line = assert_refused(result, "are different models (vocab size 128 vs 200, target vs GGUF)")
    assert "architecture" not in line


def test_the_same_models_gguf_passes_and_its_sha256_is_recorded(tmp_path, tiny_folder):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    notes = []
    _, folder, record = check_targets(str(tiny_folder), str(gguf), "llama.cpp", notes.append)
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert folder == tiny_folder
    assert record == {"target_gguf": str(gguf), "target_gguf_sha256": digest,
                      "target_gguf_verified": "header only"}
    assert notes and "no tiny.gguf.sha256 beside" in notes[0] and "sha256sum" in notes[0]
    sidecar = tmp_path / "tiny.gguf.sha256"
    sidecar.write_text(f"{digest}  tiny.gguf\n")  # as `sha256sum` writes it
    notes.clear()
    _, _, record = check_targets(str(tiny_folder), str(gguf), "llama.cpp", notes.append)
    assert record["target_gguf_verified"] == "sha256 recorded in tiny.gguf.sha256"
    assert notes == []


def test_a_users_gguf_that_differs_from_its_sha256_file_is_refused(tmp_path, tiny_folder,
                                                                    export_dir, prompt_file):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "tiny.gguf.sha256").write_text(hashlib.sha256(gguf.read_bytes()).hexdigest())
    _flip_a_byte(gguf, gguf.stat().st_size - 100)
    result, out = _serve_check(tmp_path, export_dir, prompt_file, "--target", str(tiny_folder),
                               "--target-gguf", str(gguf))
    assert_refused(result, f"{gguf} is corrupted", "differs from the one recorded in",
                   "tiny.gguf.sha256")
    assert not out.exists()
    (tmp_path / "tiny.gguf.sha256").write_text("not a digest\n")
    result, _ = _serve_check(tmp_path, export_dir, prompt_file, "--target", str(tiny_folder),
                             "--target-gguf", str(gguf))
    assert_refused(result, "tiny.gguf.sha256 holds no sha256", "sha256sum")


@pytest.mark.parametrize("damage", ["truncated", "not a gguf"])
def test_an_unreadable_gguf_is_refused(tmp_path, tiny_folder, export_dir, prompt_file, damage):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = gguf.read_bytes()
    gguf.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"PK\x03\x04" + data)
    result, out = _serve_check(tmp_path, export_dir, prompt_file, "--target", str(tiny_folder),
                               "--target-gguf", str(gguf))
    assert_refused(result, f"{gguf} is not a readable GGUF file", "truncated or damaged")
    assert not out.exists()


def _executable(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(("engine", "variable", "module"), [
    ("vllm", "DRAFTSMITH_VLLM_PYTHON", "vllm"),
    ("llama.cpp", "DRAFTSMITH_LLAMA_CPP_PYTHON", "xllamacpp"),
])
@pytest.mark.parametrize("kind", ["missing", "folder", "not executable", "no engine"])
def test_an_engine_python_that_cannot_serve_is_refused_first(tmp_path, tiny_folder, export_dir,
                                                             prompt_file, monkeypatch, engine,
                                                             variable, module, kind):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    if kind == "folder":
        python.mkdir()
    elif kind == "not executable":
        python.write_text("#!/bin/sh\nexit 0\n")
    elif kind == "no engine":  # runs, but finds no engine module (as a Python without it)
        _executable(python, "#!/bin/sh\nexit 1\n")
    monkeypatch.setenv(variable, str(python))
    gguf = ["--target-gguf", str(tmp_path / "never-read.gguf")] if engine == "llama.cpp" else []
    result, out = _serve_check(tmp_path, export_dir, prompt_file, "--engine", engine,
                               "--target", str(tiny_folder), *gguf)
    problem = {"missing": "does not exist", "folder": "is a folder, not a Python executable",
               "not executable": "is not executable",
               "no engine": f"has no `{module}` module"}[kind]
    assert_refused(result, f"${variable}={python} {problem}",
                   f"point ${variable} at a Python that has `{module}` installed, or unset it")
    assert not out.exists()


def test_an_engine_python_with_the_engine_is_used(tmp_path, monkeypatch):
    from draftsmith.engines.engine_env import own_engine_python

    python = _executable(tmp_path / "python", "#!/bin/sh\nexit 0\n")  # finds the module
    monkeypatch.setenv("DRAFTSMITH_VLLM_PYTHON", str(python))
    assert own_engine_python("vllm") == python
    monkeypatch.delenv("DRAFTSMITH_VLLM_PYTHON")
    assert own_engine_python("vllm") is None


def test_target_gguf_with_vllm_is_refused(tmp_path, tiny_folder):
    with pytest.raises(DraftsmithError, match=r"--target-gguf and --target-outtype are for "
                       r"--engine llama\.cpp"):
        check_targets(str(tiny_folder), str(tmp_path / "x.gguf"), "vllm")
    with pytest.raises(DraftsmithError, match=r"--target-outtype are for --engine llama\.cpp"):
        check_targets(str(tiny_folder), None, "vllm", target_outtype="f32")


def test_a_target_gguf_and_a_target_outtype_together_are_refused(tmp_path, tiny_folder):
    with pytest.raises(DraftsmithError, match="not both"):
        check_targets(str(tiny_folder), str(tmp_path / "x.gguf"), "llama.cpp",
                      target_outtype="f32")
    with pytest.raises(DraftsmithError, match="--target-outtype 'q4_0': choose one of f32"):
        check_targets(str(tiny_folder), None, "llama.cpp", target_outtype="q4_0")
