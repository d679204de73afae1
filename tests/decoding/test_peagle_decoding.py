"""P-EAGLE decoding: one drafter forward per step drafts the whole chain or tree; greedy decoding
reproduces the target's plain greedy output for chains and best-first trees, alone, from one- and
two-token prompts and inside the prompt-lookup hybrid; sampled decoding passes the sampling gate
(chi-square on a tiny vocabulary; false-failure odds as tests/eval/test_sampling_gate.py states)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import TreeSettings, drafter_family
from draftsmith.decoding.proposers.hybrid import LookupHybridProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.proposers.tree_expansion import DynamicTreeConfig
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.eval.batch_sizes import Turn
from draftsmith.eval.lossless import sampling_gate
from tests.eval.test_sampling_gate import PROMPT as GATE_PROMPT
from tests.eval.test_sampling_gate import SAMPLES, V, _executor, _peaked
from tests.helpers.export_helpers import build_drafter, plain_greedy
from tests.helpers.tiny_targets import tiny_target

NEW = 30
REPEATING = [5, 9, 17, 33, 8, 5, 9, 17, 40, 41, 5, 9, 17, 33, 8, 60, 5, 9]
SHAPES = {"chain": TreeSettings("chain", chain_length=4),
          "dynamic": TreeSettings("dynamic", dynamic=DynamicTreeConfig(3, 4, 9))}


def proposer(target, shape, **settings):
    module = build_drafter("peagle", target, {"draft_vocab_size": 100, "num_depths": 4,
                                              **settings})
    return drafter_family("parallel")(module, SHAPES[shape], f"peagle_{shape}")


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_decoding_reproduces_plain_greedy(family, shape):
    target = tiny_target(family)
    runner = CausalLMRunner(target, output_hidden_states=True)
    prompt = torch.randint(2, 128, (18,), generator=torch.Generator().manual_seed(3)).tolist()
    for settings in ({}, {"fc_norm": True, "norm_output": True}):
        result = generate(runner, proposer(target, shape, **settings), prompt, NEW)
        assert result.tokens == plain_greedy(target, prompt, NEW), settings
        assert max(result.depth_per_step) >= 2, "never drafted past depth 1"
    for short in ([7], [7, 11]):  # no target feature before the root, or one
        result = generate(runner, proposer(target, shape), short, NEW)
        assert result.tokens == plain_greedy(target, short, NEW)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_inside_the_lookup_hybrid(shape):
    target = tiny_target("llama")
    hybrid = LookupHybridProposer(proposer(target, shape), PromptLookupProposer(4, 3), 2, "hybrid")
    result = generate(CausalLMRunner(target, output_hidden_states=True), hybrid, REPEATING, NEW)
    assert result.tokens == plain_greedy(target, REPEATING, NEW)
    assert hybrid.lookup_steps >= 1 and hybrid.drafter_steps >= 1


@pytest.mark.parametrize("shape", list(SHAPES))
def test_one_drafter_forward_per_step_whatever_the_depth(shape, monkeypatch):
    target = tiny_target("llama")
    drafting = proposer(target, shape)
    calls = []
    step = drafting.drafter.step
    monkeypatch.setattr(drafting.drafter, "step", lambda *a, **k: calls.append(1) or step(*a, **k))
    result = generate(CausalLMRunner(target, output_hidden_states=True), drafting, REPEATING, NEW)
    drafted = sum(1 for depth in result.depth_per_step if depth > 0)
    assert max(result.depth_per_step) >= 2 and len(calls) == drafted


def test_sampled_chains_and_trees_pass_the_sampling_gate(tmp_path):
    model, weak = _peaked(0), _peaked(1)
    module = build_drafter("peagle", model, {"draft_vocab_size": V - 4, "num_depths": 3})
    methods = ("drafter_chain@peagle", "drafter_dynamic@peagle", "drafter_lookup@peagle")
    executor = _executor(tmp_path, methods, model, weak, {"peagle": ("peagle", module)})
    report = sampling_gate(executor, [Turn("tiny", "0", 0, GATE_PROMPT, [])], SAMPLES,
                           log=lambda m: 0)
    assert [r["method"] for r in report["results"]] == ["plain", *methods]  # plain: the control
    assert report["failures"] == [], report["results"]
    assert all(r["dof"] >= 4 for r in report["results"]), "too few bins to test anything"
