"""The EAGLE-1/2 layout serves the trained drafter in both engines that load it (issue 52, cases 1
and 2): SGLang builds its EAGLE-1 class from the first architecture name, neither engine builds
attention biases, and vLLM, which drops `fc.bias`, is named only for a drafter without a trained
bias: a drafter trained with one (as before `fc_bias` existed) is exported with a warning, its
card names SGLang only, and serve-check refuses it in vLLM."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import check_exported, export_drafter, read_exported
from draftsmith.registry import get_spec
from tests.helpers.export_helpers import make_checkpoint, tiny_target


def old_biased_checkpoint(tmp_path):
    """An EAGLE-1 drafter as draftsmith trained it before `fc_bias`: fc with a trained bias, and
    settings that do not mention it."""
    target, module, folder = make_checkpoint(tmp_path, "eagle1", settings={"fc_bias": True})
    meta = json.loads((folder / "draftsmith_drafter.json").read_text())
    del meta["drafter_config"]["fc_bias"]
    (folder / "draftsmith_drafter.json").write_text(json.dumps(meta))
    assert module.fc.bias.any()
    return target, module, folder


def test_eagle1_trains_without_an_fc_bias_by_default():
    drafter = get_spec("eagle1").build(tiny_target("llama").config, get_spec("eagle1").make_config())
    assert "fc.bias" not in dict(drafter.named_parameters())  # nothing to train
    assert not drafter.state_dict()["fc.bias"].any()  # the zero tensor the layout carries
    biased = get_spec("eagle1").build(tiny_target("llama").config,
                                      get_spec("eagle1").make_config({"fc_bias": True}))
    assert "fc.bias" in dict(biased.named_parameters())


def test_eagle_layout_names_sglangs_class_and_no_attention_bias(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle1")
    out = export_drafter(folder, "eagle", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"][0] == "LlamaForCausalLMEagle"
    # vLLM (method "eagle") prefixes each name and builds the first it registers
    assert "EagleLlamaForCausalLM" in ["Eagle" + a for a in config["architectures"]]
    assert not config.get("bias") and not config.get("attention_bias")
    card = (out / "README.md").read_text()
    assert '"method": "eagle"' in card and "--speculative-algorithm EAGLE" in card


def test_an_old_export_with_a_bias_key_or_llama_class_fails_the_check(tmp_path):
    target, _, folder = make_checkpoint(tmp_path, "eagle1")
    out = export_drafter(folder, "eagle", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    for old in ({"architectures": ["LlamaForCausalLM"]}, {"bias": True}):
        (out / "config.json").write_text(json.dumps({**config, **old}))
        with pytest.raises(DraftsmithError, match=next(iter(old))):
            check_exported(out, target.config)


def test_a_trained_fc_bias_is_not_sent_to_vllm(tmp_path):
    target, module, folder = old_biased_checkpoint(tmp_path)
    with pytest.warns(UserWarning, match="vLLM's EAGLE loader"):
        out = export_drafter(folder, "eagle", tmp_path / "out")
    assert torch.equal(load_file(out / "model.safetensors")["fc.bias"], module.fc.bias)
    card = (out / "README.md").read_text()
    assert '"method": "eagle"' not in card and "Not served by vLLM" in card
    assert "--speculative-algorithm EAGLE" in card  # SGLang builds and loads the bias
    drafter = check_exported(out, target.config)
    spec = get_spec("eagle1")
    assert "vllm" in spec.unserved_by(spec.make_config(drafter.settings))  # serve-check refuses
    again, _ = read_exported(out)
    assert again.settings == {"fc_bias": True}


def test_a_drafter_trained_before_fc_bias_keeps_its_bias_when_loaded(tmp_path):
    from draftsmith.drafter_folder import load_drafter

    target, module, folder = old_biased_checkpoint(tmp_path)
    loaded = load_drafter(folder, target)
    assert torch.equal(loaded.module.fc.bias, module.fc.bias)
