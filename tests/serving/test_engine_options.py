"""What serve-check asks of each engine, without starting one: vLLM's command line and runtime
environment, the spec-decode counters read across label sets, and the option errors."""

import pytest

from draftsmith.cli import main
from draftsmith.engines.engine_requests import accepted_per_position, metric_total
from draftsmith.engines.vllm import VllmServer
from draftsmith.errors import DraftsmithError
from draftsmith.serving.serve_check import ServeCheckSettings

VLLM_METRICS = {  # as vLLM labels its series: one set per engine core and model
    'vllm:spec_decode_num_drafts_total{engine="0",model_name="target"}': 10.0,
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"}': 9.0,
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"}': 6.0,
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="target",position="1"}': 1.0,
    "llamacpp:spec_decode_num_drafts_total": 4.0,
}


def test_counters_sum_over_label_sets_and_split_by_position():
    assert metric_total(VLLM_METRICS, "vllm:spec_decode_num_drafts_total") == 10.0
    assert accepted_per_position(VLLM_METRICS, 3, "vllm") == [9.0, 7.0, 0.0]
    assert metric_total(VLLM_METRICS, "llamacpp:spec_decode_num_drafts_total") == 4.0
    assert metric_total(VLLM_METRICS, "vllm:missing_total") == 0.0


def test_vllm_command_carries_the_speculative_config(tmp_path):
    speculative = {"method": "eagle3", "model": "/x/export", "num_speculative_tokens": 3}
    server = VllmServer(tmp_path, speculative=speculative, max_model_len=512)
    server.port = 1234
    command = server.command(tmp_path / "python")
    assert command[command.index("--speculative-config") + 1] == (
        '{"method": "eagle3", "model": "/x/export", "num_speculative_tokens": 3}')
    assert command[command.index("--dtype") + 1] == "float32"
    assert command[command.index("--max-model-len") + 1] == "512"
    assert "--speculative-config" not in VllmServer(tmp_path).command(tmp_path / "python")


def test_vllm_refuses_a_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(DraftsmithError, match="not a Hugging Face model folder"):
        VllmServer(tmp_path).__enter__()


def test_unknown_engine_and_misplaced_gguf_are_one_error_each(tmp_path, capsys):
    with pytest.raises(DraftsmithError, match=r"choose llama\.cpp, vllm"):
        ServeCheckSettings(engine="sglang")
    with pytest.raises(DraftsmithError, match="--draft-outtype f32,q4_0: give distinct types"):
        ServeCheckSettings(draft_outtypes=("f32", "q4_0"))
    with pytest.raises(DraftsmithError, match=r"--draft-outtype is for llama\.cpp"):
        ServeCheckSettings(engine="vllm", draft_outtypes=("f16",))
    with pytest.raises(DraftsmithError, match=r"--dtype float32 is for vLLM"):
        ServeCheckSettings(dtype="float32")
    with pytest.raises(DraftsmithError, match="fp8"):
        ServeCheckSettings(engine="vllm", dtype="fp8")
    assert ServeCheckSettings(engine="vllm", dtype="float32").dtype == "float32"
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "prompts.txt").write_text("Hello.\n")
    assert main(["serve-check", str(tmp_path), "--engine", "vllm", "--target-gguf", "t.gguf",
                 "--prompts", str(tmp_path / "prompts.txt")]) == 2
    assert "--target-gguf and --target-outtype are for --engine llama.cpp" in capsys.readouterr().err
