"""A llama.cpp server that aborts on a request: the error carries its own assertion, and the
known one (a target graph without layer inputs for EAGLE-3/DFlash drafts) says what to do."""

from __future__ import annotations

from pathlib import Path

import draftsmith.llama_cpp.convert as gguf_module
from draftsmith.errors import DraftsmithError
from draftsmith.llama_cpp.server import DraftOptions
from draftsmith.serving.serve_check import engine_abort

DISCONNECT = DraftsmithError("llama.cpp's server at http://127.0.0.1:1 failed a completion: "
                             "Server disconnected without sending a response.")
ASSERTION = ('/workspace/thirdparty/llama.cpp/src/llama-graph.cpp:1410: GGML_ASSERT(t_layer_inp[il]'
             ' != nullptr && "layer input tensor is null") failed')


def test_a_target_graph_without_layer_inputs_is_named_with_the_way_out(tmp_path, monkeypatch):
    log = tmp_path / "engine_dflash-q8_0.log"
    log.write_text(f"main: loading model\n{ASSERTION}\n#0 0x00007ff9 in ggml_abort\n")
    monkeypatch.setattr(gguf_module, "gguf_fields",
                        lambda path: {"general.architecture": "qwen2"})
    err = engine_abort(DISCONNECT, log, Path("/c/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"),
                       DraftOptions(Path("/d/draft.gguf"), spec_type="draft-dflash"))
    text = str(err)
    assert text.startswith("llama.cpp aborted serving Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf: ")
    assert "layer input tensor is null" in text and str(log) in text
    assert "`qwen2` graph does not expose the layer inputs a draft-dflash draft reads" in text
    assert "--engine vllm" in text


def test_other_assertions_are_quoted_and_a_clean_log_keeps_the_error(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("ggml.c:12: GGML_ASSERT(ne0 > 0) failed\n")
    err = engine_abort(DISCONNECT, log, Path("/c/T.gguf"), None)
    assert "GGML_ASSERT(ne0 > 0) failed" in str(err) and "vllm" not in str(err)
    log.write_text("main: server is listening\n")
    assert engine_abort(DISCONNECT, log, Path("/c/T.gguf"), None) is DISCONNECT
    assert engine_abort(DISCONNECT, tmp_path / "none.log", Path("/c/T.gguf"), None) is DISCONNECT
