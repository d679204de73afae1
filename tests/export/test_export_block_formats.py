"""DFlash and DSpark exports write exactly the config keys and tensor names their engines read
(REFERENCE.md sections 7.1.4 and 7.2: block size at the top level and in `dflash_config`, the
layer ids written explicitly with each layout's offset, `rope_theta` equal to the target's), and
what draftsmith's block drafters do not implement is refused on read."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import ExportOptions, export_drafter, load_exported, read_exported
from draftsmith.serving.serve_check import ServeCheckSettings
from draftsmith.serving.serve_check_run import draft_length
from tests.helpers.export_helpers import make_checkpoint

H, V, N = 32, 128, 4  # tiny target: hidden, vocab, layers (4 heads, 2 KV heads, head_dim 8)
LAYER = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
         "self_attn.q_proj.weight": (32, H), "self_attn.k_proj.weight": (16, H),
         "self_attn.v_proj.weight": (16, H), "self_attn.o_proj.weight": (H, 32),
         "self_attn.q_norm.weight": (8,), "self_attn.k_norm.weight": (8,),
         "mlp.gate_proj.weight": (64, H), "mlp.up_proj.weight": (64, H),
         "mlp.down_proj.weight": (H, 64)}
IDS = [0, 2]  # dflash_layer_ids(4, 2): the reference rule repeats layer 1, so spread over 0..2
BODY = {"fc.weight": (H, 2 * H), "hidden_norm.weight": (H,), "norm.weight": (H,),
        **{f"layers.{i}.{k}": s for i in range(2) for k, s in LAYER.items()}}
FROZEN = {"embed_tokens.weight": (V, H), "lm_head.weight": (V, H)}


def shapes(path) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in load_file(path).items()}


def export(tmp_path, kind, fmt, options=None):
    target, module, folder = make_checkpoint(tmp_path, kind)
    out = export_drafter(folder, fmt, tmp_path / fmt, options=options)
    return target, module, out, json.loads((out / "config.json").read_text())


def test_dflash_native_layout(tmp_path):
    target, module, out, config = export(tmp_path, "dflash", "dflash")
    assert shapes(out / "model.safetensors") == BODY  # no embedding / head by default
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["block_size"] == config["dflash_config"]["block_size"] == 4
    assert config["dflash_config"]["target_layer_ids"] == IDS == module.target_layer_ids
    assert config["dflash_config"]["mask_token_id"] == module.mask_token_id
    assert config["num_target_layers"] == N and config["num_hidden_layers"] == 2
    assert config["rope_theta"] == target.config.rope_parameters["rope_theta"]
    assert {k: config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                   "num_key_value_heads", "head_dim", "vocab_size",
                                   "attention_bias", "tie_word_embeddings")} == {
        "hidden_size": H, "intermediate_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": V, "attention_bias": False,
        "tie_word_embeddings": False}
    card = (out / "README.md").read_text()
    assert '"method": "dflash"' in card and '"num_speculative_tokens": 3' in card
    assert "--speculative-algorithm DFLASH" in card and "--speculative-num-draft-tokens 4" in card


def test_dflash_include_frozen_writes_the_targets_copies(tmp_path):
    _, _, out, _ = export(tmp_path, "dflash", "dflash", ExportOptions(include_frozen=True))
    assert shapes(out / "model.safetensors") == {**BODY, **FROZEN}


def test_dflash_speculators_layout(tmp_path):
    _, module, out, config = export(tmp_path, "dflash", "dflash-speculators")
    assert shapes(out / "model.safetensors") == BODY
    assert config["architectures"] == ["DFlashSpeculator"]
    assert config["speculators_model_type"] == "dflash"
    assert config["aux_hidden_state_layer_ids"] == [i + 1 for i in IDS]  # z-lab ids + 1
    assert config["block_size"] == 4 and config["mask_token_id"] == module.mask_token_id
    assert config["sample_from_anchor"] is False and config["draft_vocab_size"] == V
    layer = config["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["hidden_size"]) == (
        "qwen3", 2, H)
    spec = config["speculators_config"]
    assert spec["algorithm"] == "dflash"
    assert spec["proposal_methods"][0]["speculative_tokens"] == 3
    assert read_exported(out)[0].aux_layer_ids == IDS


def test_dspark_deepspec_layout(tmp_path):
    _, module, out, config = export(tmp_path, "dspark", "dspark")
    assert shapes(out / "model.safetensors") == {
        **BODY, **FROZEN, "markov_head.markov_w1.weight": (V, 8),
        "markov_head.markov_w2.weight": (V, 8), "confidence_head.proj.weight": (1, H + 8),
        "confidence_head.proj.bias": (1,)}
    assert config["architectures"] == ["Qwen3DSparkModel"]
    assert config["target_layer_ids"] == IDS and config["num_target_layers"] == N
    assert (config["block_size"], config["markov_rank"], config["markov_head_type"],
            config["sample_from_anchor"]) == (3, 8, "vanilla", True)
    assert config["mask_token_id"] == module.mask_token_id
    assert '"method": "dspark"' in (out / "README.md").read_text()


@pytest.mark.parametrize(("fmt", "edit", "message"), [
    ("dflash", {"is_causal": True}, "causal DFlash variant"),
    ("dflash", {"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window"),
    ("dflash", {"dflash_config": {"block_size": 4, "mask_token_id": 2}}, "no target layer ids"),
    ("dflash-speculators", {"sample_from_anchor": True}, "DSpark's layout"),
    ("dflash-speculators", {"projector_type": "domino"}, "projector_type='domino'"),
])
def test_what_draftsmith_does_not_implement_is_refused(tmp_path, fmt, edit, message):
    _, _, out, config = export(tmp_path, "dflash", fmt)
    (out / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(DraftsmithError, match=message):
        read_exported(out)


def test_a_reduced_draft_vocabulary_is_refused(tmp_path):
    target, _, out, _ = export(tmp_path, "dflash", "dflash")
    tensors = load_file(out / "model.safetensors")
    tensors["d2t"] = tensors["norm.weight"].long()
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(DraftsmithError, match="reduced draft vocabulary"):
        load_exported(out, target)


def test_a_missing_block_size_key_is_named(tmp_path):
    from draftsmith.export.load import check_exported

    target, _, out, config = export(tmp_path, "dflash", "dflash")
    del config["block_size"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match="lacks 'block_size'"):
        check_exported(out, target.config)


def test_serve_check_drafts_a_block_drafters_whole_block(tmp_path):
    _, _, out, _ = export(tmp_path, "dflash", "dflash")
    drafter, _ = read_exported(out)
    assert draft_length(drafter, ServeCheckSettings()).draft_max == 3
    assert draft_length(drafter, ServeCheckSettings(draft_max=3)).draft_max == 3
    with pytest.raises(DraftsmithError, match="drafts its whole block, 3 tokens"):
        draft_length(drafter, ServeCheckSettings(draft_max=2))
    _, _, eagle3, _ = export(tmp_path, "eagle3", "eagle3")
    assert draft_length(read_exported(eagle3)[0], ServeCheckSettings()).draft_max == 3
    assert draft_length(read_exported(eagle3)[0], ServeCheckSettings(draft_max=5)).draft_max == 5


@pytest.mark.parametrize("fmt", ["dflash", "dflash-speculators"])
def test_a_draft_vocabulary_is_left_out_of_the_layouts_and_said(tmp_path, capsys, fmt):
    """The layouts have no draft vocabulary (engines draft over the whole vocabulary with the
    target's head): the export writes the body alone, says so, and reads back as a full-vocabulary
    drafter with the same trained weights."""
    target, module, folder = make_checkpoint(tmp_path, "dflash", settings={
        "block_size": 4, "num_layers": 2, "draft_vocab_size": 60})
    out = export_drafter(folder, fmt, tmp_path / fmt)
    assert "draft vocabulary (60 of 128 tokens) has no place in this layout" in capsys.readouterr().out
    assert shapes(out / "model.safetensors") == BODY
    loaded = load_exported(out, target)
    assert loaded.module.draft_vocab_size == V and not loaded.module.reduced_vocab
    assert torch.equal(loaded.module.fc.weight, module.fc.weight)
