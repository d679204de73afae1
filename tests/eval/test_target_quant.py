"""Speculation over an int8 target: on a tiny random Llama, speculative decoding over the int8
copy reproduces that copy's own plain greedy output token for token (a chain and a tree, tied
head or not), hidden-state drafters read the int8 copy's hidden states, `draftsmith eval
--target-quant none,int8` writes both variants side by side and passes the lossless gate on
both, and a bad scheme is one clear error."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.eval import executor
from draftsmith.eval.decode import generate
from draftsmith.eval.proposers.draft_model import DraftModelProposer
from draftsmith.eval.proposers.feature_drafter import FeatureDrafterProposer
from draftsmith.eval.proposers.tree_expansion import DynamicTreeConfig
from draftsmith.eval.runner import CausalLMRunner
from draftsmith.quantize import parse_target_quant, quantize_model
from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.export_helpers import build_drafter, write_checkpoint
from tests.helpers.tiny_targets import save_target_and_draft, tiny_target

NEW = 24
QUANTIZED_LINEAR = torch.ao.nn.quantized.dynamic.Linear


def _plain_greedy(model, prompt: list[int]) -> list[int]:
    return model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("tied", [False, True])
def test_speculation_over_int8_target_reproduces_its_plain_greedy(tied):
    target = tiny_target("llama", tie_word_embeddings=tied)
    copy = quantize_model(target, "int8")
    quantized = copy.model
    assert copy.info["float_linears"] == ["lm_head"] and copy.info["quantized_linears"] == 28
    assert copy.info["weight_bytes_after"] < copy.info["weight_bytes_before"]
    assert type(target.model.layers[0].mlp.up_proj) is torch.nn.Linear  # the original untouched
    prompt = torch.randint(2, 128, (18,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode():
        full, int8 = target(torch.tensor([prompt])).logits, quantized(torch.tensor([prompt])).logits
    assert not torch.allclose(full, int8, atol=1e-4)  # really another model
    reference = _plain_greedy(quantized, prompt)
    drafter = build_drafter("eagle3", target)
    proposers = {
        "chain (the float target drafting)": DraftModelProposer(target, 4),
        "EAGLE-3 dynamic tree": FeatureDrafterProposer(drafter, dynamic=DynamicTreeConfig(3, 4, 10)),
    }
    runner = CausalLMRunner(quantized, output_hidden_states=True)
    for name, proposer in proposers.items():
        result = generate(runner, proposer, prompt, NEW)
        assert result.tokens == reference, name
        assert max(result.depth_per_step) >= 1, f"{name} never drafted"
    chain = generate(runner, DraftModelProposer(target, 4), prompt, NEW)
    assert sum(chain.accepted_per_step) > 0  # the float target's drafts are mostly right


def test_parse_target_quant():
    assert parse_target_quant("int8") == ("none", "int8")
    assert parse_target_quant("none,int8,int8") == ("none", "int8")
    assert parse_target_quant(("none",)) == ("none",)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    target = save_target_and_draft(root)
    drafter = write_checkpoint(root / "eagle3" / "drafter", "eagle3",
                               build_drafter("eagle3", target), target)
    prompts = root / "prompts.txt"
    prompts.write_text("Hi!\nName a colour.\n")
    return root, drafter, prompts


@pytest.mark.slow
def test_eval_runs_the_int8_target_side_by_side(setup, tmp_path, monkeypatch):
    root, drafter, prompts = setup
    seen = []  # (proposer class, model the runner verifies with, hidden states read)
    original = executor.generate

    def recording(runner, proposer, *args, **kwargs):
        seen.append((type(proposer).__name__, runner.model, runner.output_hidden_states))
        return original(runner, proposer, *args, **kwargs)

    monkeypatch.setattr(executor, "generate", recording)
    methods = "plain,draft_model,drafter_dynamic,drafter_chain"
    result = run_cli(["eval", "--target", str(root / "target"), "--draft-model",
                      str(root / "draft"), "--drafter", str(drafter), "--prompts", str(prompts),
                      "--methods", methods, "--max-new-tokens", "10", "--tree-depth", "3",
                      "--tree-total-tokens", "6", "--target-quant", "none,int8",
                      "--check-lossless", "--out", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert "lossless check passed" in result.stdout
    assert "int8: verified output is the int8 copy" in result.stdout
    payload = json.loads((tmp_path / "eval.json").read_text())
    variants = payload["target_variants"]
    assert list(variants) == ["none", "int8"]
    assert variants["none"]["quantization"] is None
    assert "not the target as loaded" in variants["int8"]["verified_output"]
    assert "multi-token verify can differ" in variants["int8"]["verified_output"]
    info = variants["int8"]["quantization"]
    assert info["scheme"] == "int8" and info["float_linears"] == ["lm_head"]
    rows = variants["int8"]["summary"]["all"]
    assert list(rows) == methods.split(",")
    assert rows["plain"]["speedup"] == 1.0 and rows["plain"]["tau"] == 1.0
    for method in methods.split(",")[1:]:
        row = rows[method]
        assert row["identical_to_plain"] == 1.0, method
        assert {"tau_drop", "acceptance_drop_by_depth", "speedup_vs_loaded_plain"} <= set(row)
        assert row["acceptance_by_depth"], method
    assert len(variants["int8"]["records"]) == 2 * len(rows)
    check = payload["lossless_check"]
    assert "drafter_dynamic (int8 target)" in check["checked"] and not check["failures"]
    assert payload["config"]["target_quant"] == ["none", "int8"]
    feature = [(model, hidden) for name, model, hidden in seen if name == "FeatureDrafterProposer"]
    quantized = [any(isinstance(m, QUANTIZED_LINEAR) for m in model.modules())
                 for model, _ in feature]
    assert any(quantized) and not all(quantized)  # EAGLE verified by both targets ...
    assert all(hidden for _, hidden in feature)  # ... reading that target's hidden states


def test_a_bad_scheme_is_one_clear_error(tmp_path):
    result = run_cli(["eval", "--target-quant", "none,int4x", "--out", str(tmp_path / "out")])
    assert_refused(result, "--target-quant 'int4x' is not a quantization scheme",
                   "choose from: none, int8")
    assert not (tmp_path / "out").exists()


def test_a_bfloat16_target_is_refused(tmp_path):
    result = run_cli(["eval", "--target-quant", "int8", "--dtype", "bfloat16",
                      "--out", str(tmp_path / "out")])
    assert_refused(result, "--target-quant none,int8 quantizes a float32 target",
                   "--dtype float32")
