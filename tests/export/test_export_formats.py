"""Each format writes exactly the config keys and tensor names its reference loader reads
(REFERENCE.md section 3), and export refuses what would not serve."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import FORMATS, export_drafter, load_exported, read_exported
from tests.helpers.export_helpers import make_checkpoint

H, V, N = 32, 128, 4  # tiny target: hidden, vocab, layers (4 heads, 2 KV heads, head_dim 8)
ATTN = {"self_attn.q_proj.weight": (32, 32), "self_attn.k_proj.weight": (16, 32),
        "self_attn.v_proj.weight": (16, 32), "self_attn.o_proj.weight": (32, 32)}
MLP = {"mlp.gate_proj.weight": (64, 32), "mlp.up_proj.weight": (64, 32),
       "mlp.down_proj.weight": (32, 64), "post_attention_layernorm.weight": (32,)}
EAGLE3_LAYER = {**{k: (s[0], 2 * H) if k != "self_attn.o_proj.weight" else s
                   for k, s in ATTN.items()},
                **MLP, "input_layernorm.weight": (H,), "hidden_norm.weight": (H,)}
EAGLE3_REST = {"embed_tokens.weight": (V, H), "fc.weight": (H, 3 * H), "norm.weight": (H,),
               "lm_head.weight": (100, H), "d2t": (100,), "t2d": (V,)}


def shapes(path) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in load_file(path).items()}


def export(tmp_path, kind, fmt, **settings):
    target, module, folder = make_checkpoint(tmp_path, kind, **settings)
    out = export_drafter(folder, fmt, tmp_path / fmt)
    config = json.loads((out / "config.json").read_text())
    assert {"README.md", "config.json", "draftsmith_drafter.json"} <= {p.name for p in out.iterdir()}
    assert not [p for p in out.iterdir() if p.suffix in (".bin", ".pt", ".pth")]
    meta = json.loads((out / "draftsmith_drafter.json").read_text())
    assert meta["export"]["format"] == fmt and meta["training_steps"] == 7
    return target, module, out, config


def test_eagle3_official_layout(tmp_path):
    _, module, out, config = export(tmp_path, "eagle3", "eagle3")
    assert shapes(out / "model.safetensors") == {
        **{f"midlayer.{k}": s for k, s in EAGLE3_LAYER.items()}, **EAGLE3_REST}
    tensors = load_file(out / "model.safetensors")
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert torch.equal(tensors["d2t"], module.d2t) and int(tensors["t2d"].sum()) == 100
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert {k: config[k] for k in ("model_type", "hidden_size", "intermediate_size",
                                   "num_attention_heads", "num_key_value_heads", "head_dim",
                                   "num_hidden_layers", "vocab_size", "draft_vocab_size",
                                   "tie_word_embeddings", "target_hidden_size",
                                   "max_position_embeddings")} == {
        "model_type": "llama", "hidden_size": H, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": 100,
        "tie_word_embeddings": False, "target_hidden_size": H, "max_position_embeddings": 512}
    assert {"rms_norm_eps", "rope_theta", "rope_scaling"} <= set(config)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]


def test_speculators_layout(tmp_path):
    _, _, out, config = export(tmp_path, "eagle3", "speculators")
    assert shapes(out / "model.safetensors") == {
        **{f"layers.0.{k}": s for k, s in EAGLE3_LAYER.items()}, **EAGLE3_REST}
    assert config["architectures"] == ["Eagle3DraftModel"]
    assert config["speculators_model_type"] == "eagle3"
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # hidden_states indices
    assert config["draft_vocab_size"] == 100 and config["target_hidden_size"] == H
    assert config["norm_before_residual"] is False  # vLLM assumes true when absent
    layer = config["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["hidden_size"],
            layer["vocab_size"]) == ("llama", 1, H, V)
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["proposal_type"] == "greedy"
    # the in-memory tiny target's config records no architectures
    assert spec["verifier"] == {"name_or_path": "test-org/tiny-target", "architectures": []}


def test_eagle_layout(tmp_path):
    _, _, out, config = export(tmp_path, "eagle1", "eagle")
    assert shapes(out / "model.safetensors") == {
        "embed_tokens.weight": (V, H), "fc.weight": (H, 2 * H), "fc.bias": (H,),
        **{f"layers.0.{k}": s for k, s in {**ATTN, **MLP}.items()}}
    # SGLang builds its EAGLE-1 class (the first name); vLLM's method "eagle" the second, prefixed
    assert config["architectures"] == ["LlamaForCausalLMEagle", "LlamaForCausalLM"]
    assert "bias" not in config and config["attention_bias"] is False  # no q/k/v/o biases
    assert not load_file(out / "model.safetensors")["fc.bias"].any()  # trained without one
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (1, H, V)


def test_medusa_layout(tmp_path):
    _, _, out, config = export(tmp_path, "medusa", "medusa")
    assert not (out / "model.safetensors").exists()
    expected = {}
    for i in range(3):
        expected |= {f"{i}.0.linear.weight": (H, H), f"{i}.0.linear.bias": (H,),
                     f"{i}.1.weight": (V, H)}
    assert shapes(out / "medusa_lm_head.safetensors") == expected
    assert {k: config[k] for k in ("medusa_num_heads", "medusa_num_layers",
                                   "base_model_name_or_path", "hidden_size", "vocab_size")} == {
        "medusa_num_heads": 3, "medusa_num_layers": 1,
        "base_model_name_or_path": "test-org/tiny-target", "hidden_size": H, "vocab_size": V}


def test_mtp_deepseek_layout(tmp_path):
    _, _, out, config = export(tmp_path, "mtp", "mtp")
    per_layer = {"enorm.weight": (H,), "hnorm.weight": (H,), "eh_proj.weight": (H, 2 * H),
                 "input_layernorm.weight": (H,), **ATTN, **MLP, "shared_head.norm.weight": (H,),
                 "shared_head.head.weight": (V, H), "embed_tokens.weight": (V, H)}
    assert shapes(out / "model.safetensors") == {
        f"model.layers.{n}.{k}": s for n in (N, N + 1) for k, s in per_layer.items()}
    assert config["num_nextn_predict_layers"] == 2 and config["num_hidden_layers"] == N


def test_sglang_nextn_renumbered_layout_loads(tmp_path):
    target, module, out, config = export(tmp_path, "mtp", "mtp")
    renumbered = {k.replace(f"layers.{N}.", "layers.0.").replace(f"layers.{N + 1}.", "layers.1."): v
                  for k, v in load_file(out / "model.safetensors").items()}
    save_file(renumbered, out / "model.safetensors")
    config["architectures"] = ["DeepseekV3ForCausalLMNextN"]
    (out / "config.json").write_text(json.dumps(config))
    loaded = load_exported(out, target)
    for name, value in module.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[name], value), name


def test_format_must_hold_the_kind(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "medusa")
    with pytest.raises(DraftsmithError, match=r"--format eagle3 holds eagle3 .* use --format medusa"):
        export_drafter(folder, "eagle3", tmp_path / "out")
    with pytest.raises(DraftsmithError, match="unknown export format 'onnx'"):
        export_drafter(folder, "onnx", tmp_path / "out")
    with pytest.raises(DraftsmithError, match=r"--format gguf holds EAGLE-3 .* use --format medusa"):
        export_drafter(folder, "gguf", tmp_path / "out")


def test_unservable_layer_ids_are_refused(tmp_path):
    # a checkpoint that records repeated ids (drafters refuse them when built, so edit the record)
    _, _, folder = make_checkpoint(tmp_path, "eagle3", settings={"draft_vocab_size": 100})
    meta = json.loads((folder / "draftsmith_drafter.json").read_text())
    (folder / "draftsmith_drafter.json").write_text(json.dumps({**meta, "aux_layers": [1, 1, 0]}))
    with pytest.raises(DraftsmithError, match=r"\[1, 1, 0\] are not strictly increasing"):
        export_drafter(folder, "speculators", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_existing_output_and_re_export(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle1")
    out = export_drafter(folder, "eagle", tmp_path / "out")
    with pytest.raises(DraftsmithError, match=r"exists and is not empty.*--force"):
        export_drafter(folder, "eagle", out)
    export_drafter(folder, "eagle", out, overwrite=True)
    with pytest.raises(DraftsmithError, match="looks like an export already"):
        export_drafter(out, "eagle", tmp_path / "again")


def test_format_detection_needs_a_known_layout(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    save_file({"wte.weight": torch.zeros(4, 4)}, tmp_path / "model.safetensors")
    with pytest.raises(DraftsmithError, match="cannot tell the checkpoint format"):
        read_exported(tmp_path)


def test_cli_format_is_checked_against_the_registry(tmp_path):
    """`--format` takes what FORMATS registers (and gguf): a new format needs no CLI edit."""
    from tests.helpers.cli import assert_refused, run_cli

    result = run_cli(["export", str(tmp_path), "--format", "onnx", "--out", str(tmp_path / "o")])
    assert_refused(result, "--format 'onnx' is not an export format; choose one of: "
                   f"{', '.join(FORMATS)}, gguf")
