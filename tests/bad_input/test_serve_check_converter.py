"""serve-check of a DFlash export for a Qwen2 target stopped in llama.cpp's converter ("BPE
pre-tokenizer was not recognized") with no next step; it names the problem and what to do
(issue #55)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.export import gguf
from draftsmith.serving.serve_check_run import _run_llama_cpp

TAIL = ("llama.cpp's convert_hf_to_gguf.py could not convert runs/export/dflash:\n"
        "WARNING:hf-to-gguf:** WARNING: The BPE pre-tokenizer was not recognized!\n"
        "NotImplementedError: BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")


def run_with_converter_error(tmp_path, monkeypatch, message):
    def refuse(*args, **kwargs):
        raise DraftsmithError(message)

    monkeypatch.setattr(gguf, "convert_to_gguf", refuse)
    settings = SimpleNamespace(draft_outtypes=("f32",))
    with pytest.raises(DraftsmithError) as refused:
        _run_llama_cpp(tmp_path / "export", tmp_path / "qwen2", tmp_path / "target.gguf", [],
                       settings, "draft-dflash", tmp_path / "out", lambda line: None)
    return str(refused.value)


def test_an_unrecognized_pre_tokenizer_names_the_tokenizer_and_the_next_step(tmp_path,
                                                                            monkeypatch):
    message = run_with_converter_error(tmp_path, monkeypatch, TAIL)
    assert ("does not recognize the BPE pre-tokenizer of the target tokenizer in "
            f"{tmp_path / 'qwen2'}") in message
    assert "Next: pass as --target a folder with the model's upstream tokenizer" in message
    assert "--engine vllm" in message


def test_other_converter_failures_are_quoted_as_they_were(tmp_path, monkeypatch):
    other = "llama.cpp's convert_hf_to_gguf.py could not convert X:\nKeyError: 'fc.weight'"
    assert run_with_converter_error(tmp_path, monkeypatch, other) == other
