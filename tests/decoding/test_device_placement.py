"""Every decode path creates its tensors on its input's device, not on torch's default device.

The trap: the models and inputs live on the CPU while torch's default device is `meta` (a device
that holds no data). A tensor created without naming a device lands on `meta`, and the first time
it meets a CPU tensor or is read (`.tolist()`, `int(...)`) the run fails. On a GPU the same bug
indexes a CPU tensor with a CUDA one, or copies to the host on every node. Every proposer, tree
shape, sampling and the batched loop run under the trap, and still reproduce plain decoding.
"""

from __future__ import annotations

import pytest
import torch

from draftsmith.decoding.batched import generate_batch
from draftsmith.decoding.batched_runner import BatchedLMRunner
from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import NoDraftProposer
from draftsmith.decoding.proposers.draft_model import DraftModelProposer, DraftModelTreeProposer
from draftsmith.decoding.proposers.hybrid import LookupHybridProposer
from draftsmith.decoding.proposers.lookahead import LookaheadProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.proposers.rest import RestProposer
from draftsmith.decoding.proposers.tree_expansion import DEFAULT_CHOICES, DynamicTreeConfig
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.drafter_folder import LoadedDrafter
from draftsmith.eval.methods import make_drafter_proposer
from draftsmith.eval.settings import DecodeSettings
from draftsmith.registry import DRAFTERS
from tests.decoding.test_decode import _prompt, _reference
from tests.decoding.test_rest import _store
from tests.helpers.drafters import small_settings
from tests.helpers.export_helpers import build_drafter
from tests.helpers.tiny_targets import tiny_target

NEW = 16


def _proposers(target) -> dict:
    """name -> (proposer factory, needs the target's hidden states); built before the trap."""
    weak = tiny_target("llama", seed=1)
    settings = DecodeSettings(num_draft_tokens=3, tree_topk=2, tree_depth=3, tree_total_tokens=6)
    out = {
        "plain": (NoDraftProposer, False),
        "prompt_lookup": (lambda: PromptLookupProposer(num_tokens=4), False),
        "draft_model_chain": (lambda: DraftModelProposer(weak, num_tokens=3), False),
        "draft_model_static": (lambda: DraftModelTreeProposer(target, DEFAULT_CHOICES), False),
        "draft_model_dynamic": (lambda: DraftModelTreeProposer(
            target, dynamic=DynamicTreeConfig(2, 4, 8)), False),
        "lookahead": (lambda: LookaheadProposer(3, 3, 3), False),
    }
    prompt = _prompt(0)
    store = _store([prompt[-4:] + _reference(target, prompt, NEW)])
    out["rest"] = (lambda: RestProposer(store, 8), False)
    for kind, spec in DRAFTERS.items():
        loaded = LoadedDrafter(kind, build_drafter(kind, target, small_settings(kind)), {})
        for shape in spec.tree_shapes:
            method = f"drafter_{shape}"
            out[f"{kind}_{shape}"] = (lambda loaded=loaded, method=method: make_drafter_proposer(
                method, loaded, settings), True)
        out[f"{kind}_hybrid"] = (lambda loaded=loaded: LookupHybridProposer(
            make_drafter_proposer("drafter", loaded, settings), PromptLookupProposer(4), 2,
            "hybrid"), True)
    return out


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_decode_path_keeps_its_tensors_on_its_inputs_device(target, temperature):
    sampling = SamplingConfig(temperature=temperature, seed=3)
    prompt = _prompt(0)
    reference = _reference(target, prompt, NEW)
    for name, (make, hidden) in _proposers(target).items():
        runner = CausalLMRunner(target, output_hidden_states=hidden)
        proposer = make()
        expected = generate(runner, make(), prompt, NEW, sampling=sampling).tokens
        with torch.device("meta"):
            result = generate(runner, proposer, prompt, NEW, sampling=sampling)
        assert result.tokens == expected, name
        if temperature == 0:
            assert result.tokens == reference, name


def test_batched_chains_keep_their_tensors_on_their_inputs_device(target):
    prompts = [_prompt(0, 20), _prompt(1, 9), [7]]
    references = [_reference(target, p, NEW) for p in prompts]
    chains = {name: item for name, item in _proposers(target).items()
              if name in ("plain", "prompt_lookup", "draft_model_chain")
              or name.endswith("_chain")}
    for name, (make, hidden) in chains.items():
        runner = BatchedLMRunner(target, output_hidden_states=hidden)
        proposers = [make() for _ in prompts]
        with torch.device("meta"):
            results = generate_batch(runner, proposers, prompts, NEW)
        assert [r.tokens for r in results.rows] == references, name
