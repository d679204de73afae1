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


def test_a_draft_vocabulary_without_its_head_is_refused(tmp_path):
    target, _, out, _ = export(tmp_path, "dflash", "dflash")
    tensors = load_file(out / "model.safetensors")
    tensors["d2t"] = tensors["norm.weight"].long()
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(DraftsmithError, match="lm_head has none"):
        load_exported(out, target)


def test_dspark_refuses_a_draft_vocabulary(tmp_path):
    target, _, out, _ = export(tmp_path, "dspark", "dspark")
    tensors = load_file(out / "model.safetensors")
    tensors["d2t"] = torch.zeros(8, dtype=torch.long)
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
def test_a_draft_vocabulary_is_exported_as_vllm_loads_it(tmp_path, fmt):
    """vLLM's DFlash (qwen3_dflash.py, 0.32 and 0.33) builds a head of `draft_vocab_size` rows and
    maps its logits through d2t: the export carries the reduced head, d2t and t2d and says Vd, so
    the served drafter proposes what draftsmith evaluated (issue 52 case 7: it used to drop them,
    and the engine drafted over the whole vocabulary with the target's head)."""
    target, module, folder = make_checkpoint(tmp_path, "dflash", settings={
        "block_size": 4, "num_layers": 2, "draft_vocab_size": 60})
    out = export_drafter(folder, fmt, tmp_path / fmt)
    assert shapes(out / "model.safetensors") == {**BODY, "lm_head.weight": (60, H),
                                                 "d2t": (60,), "t2d": (V,)}
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 60
    loaded = load_exported(out, target)
    assert loaded.module.draft_vocab_size == 60 and loaded.module.reduced_vocab
    for name in ("d2t", "t2d", "lm_head.weight", "fc.weight"):
        assert torch.equal(loaded.module.state_dict()[name], module.state_dict()[name]), name
    # what vLLM drafts: the reduced logits scattered to ids base + d2t, argmax over the vocabulary
    hidden = torch.randn(5, H)
    reduced = loaded.module.lm_head(hidden)
    served = torch.full((5, V), float("-inf"))
    served[:, torch.arange(60) + loaded.module.d2t] = reduced
    ours = reduced.argmax(-1) + loaded.module.d2t[reduced.argmax(-1)]
    assert torch.equal(served.argmax(-1), ours)
    card = (out / "README.md").read_text()
    assert '"method": "dflash"' in card
    assert "--speculative-algorithm DFLASH" not in card and "SGLang's DFlash" in card


def test_a_draft_vocabulary_dflash_is_refused_where_engines_drop_it(tmp_path):
    """SGLang's DFlash declares no draft head and skips d2t, llama.cpp's converter drops both:
    each would serve a full-vocabulary drafter, so GGUF export and the registry refuse them."""
    from draftsmith.registry import get_spec

    _, _, folder = make_checkpoint(tmp_path, "dflash", settings={
        "block_size": 4, "num_layers": 2, "draft_vocab_size": 60})
    with pytest.raises(DraftsmithError, match="retrain with the full vocabulary"):
        export_drafter(folder, "gguf", tmp_path / "gguf")
    spec = get_spec("dflash")
    unserved = spec.unserved_by(spec.make_config({"draft_vocab_size": 60}))
    assert set(unserved) == {"sglang", "llama.cpp"}
    assert spec.unserved_by(spec.make_config({})) == {}
    from draftsmith.export.gguf import _stage

    native = export_drafter(folder, "dflash", tmp_path / "native")
    with pytest.raises(DraftsmithError, match="GGUF converter"):
        _stage(native, tmp_path / "staged")
