"""The config keys each engine reads to build the drafter we trained (issue 52, cases 3, 4, 5 and
9): vLLM's speculators DFlash conversion builds non-causal layers, vLLM 0.32's Medusa keeps the
ResBlock biases, the `eagle3` layout's aux layer ids are found by SGLang and both vLLM runners in
their own numbering, and `export --check` refuses the DFlash settings `eval` refuses."""

from __future__ import annotations

import json

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.export import check_exported, export_drafter
from tests.helpers.export_helpers import make_checkpoint


def exported(tmp_path, kind, fmt, settings=None):
    target, _, folder = make_checkpoint(tmp_path, kind, settings=settings)
    out = export_drafter(folder, fmt, tmp_path / fmt)
    return target, out, json.loads((out / "config.json").read_text())


def vllm_update_dflash_causal(config: dict) -> bool:
    """vLLM 0.32 / 0.33 `transformers_utils/configs/speculators/algos.py` `update_dflash`."""
    return not config.get("sliding_window_non_causal", True)


def test_dflash_speculators_layout_is_non_causal_in_vllm(tmp_path):
    target, out, config = exported(tmp_path, "dflash", "dflash-speculators")
    assert config["sliding_window_non_causal"] is True
    assert vllm_update_dflash_causal(config) is False
    (out / "config.json").write_text(json.dumps({**config, "sliding_window_non_causal": False}))
    with pytest.raises(DraftsmithError, match="sliding_window_non_causal"):
        check_exported(out, target.config)  # an old export: vLLM would serve it causal


def test_medusa_layout_keeps_its_resblock_biases_in_vllm(tmp_path):
    _, out, config = exported(tmp_path, "medusa", "medusa")
    assert config["medusa_fc_bias"] is True  # vLLM 0.32 builds the biases only then
    card = (out / "README.md").read_text()
    assert "vLLM up to 0.32" in card and "0.33 removed Medusa" in card
    assert '"method": "medusa"' in card


def vllm_new_runner_ids(config: dict) -> list[int] | None:
    """vLLM 0.33 `v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`, EAGLE-3 path."""
    return config.get("eagle_aux_hidden_state_layer_ids") or (
        config.get("eagle_config") or {}).get("layer_ids")


def vllm_old_runner_ids(config: dict) -> list[int] | None:
    """vLLM 0.32 / 0.33 `v1/worker/gpu_model_runner.py`."""
    return config.get("eagle_aux_hidden_state_layer_ids") or (
        config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")


def sglang_capture_ids(config: dict) -> list[int]:
    """SGLang 0.5.23: eagle_config's ids, plus 1 in `set_eagle3_layers_to_capture`."""
    return [i + 1 for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]


def test_eagle3_layout_custom_ids_reach_every_reader(tmp_path):
    # non-default ids: vLLM's fallback for 4 target layers would be (2, 2, 1)
    settings = {"draft_vocab_size": 100, "layer_ids": [0, 1, 3]}
    target, out, config = exported(tmp_path, "eagle3", "eagle3", settings)
    inputs = [1, 2, 4]  # the layer inputs (output + 1) every engine captures
    assert vllm_new_runner_ids(config) == inputs
    assert vllm_old_runner_ids(config) == inputs
    assert sglang_capture_ids(config) == inputs
    assert '"method": "eagle3"' in (out / "README.md").read_text()
    del config["eagle_aux_hidden_state_layer_ids"]  # an old export: vLLM's new runner guesses
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match="eagle_aux_hidden_state_layer_ids"):
        check_exported(out, target.config)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("mask_token_id", 128, "mask_token_id 128 is outside the target's vocabulary"),
    ("block_size", 0, "block_size=0 must be >= 2"),
])
def test_export_check_refuses_dflash_settings_eval_refuses(tmp_path, key, value, message):
    target, out, config = exported(tmp_path, "dflash", "dflash")
    config["dflash_config"][key] = value
    if key == "block_size":
        config[key] = value
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match=message):
        check_exported(out, target.config)


def test_dflash_gguf_of_a_llama3_rope_target_is_refused_naming_rope_freqs(tmp_path):
    from draftsmith.export.gguf import _stage

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    _, _, folder = make_checkpoint(tmp_path, "dflash", rope_parameters=rope)
    out = export_drafter(folder, "dflash", tmp_path / "dflash")
    with pytest.raises(DraftsmithError, match="rope_freqs"):
        _stage(out, tmp_path / "staged")
