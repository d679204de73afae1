"""EAGLE-3's and P-EAGLE's `freeze_head`: the draft head keeps the target's draft-vocabulary rows through
training (no gradient, no optimizer state, Muon or AdamW), everything else still trains, and the
head is still part of the saved drafter (engines read the draft-vocabulary rows from it)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.models.features import target_features
from draftsmith.registry import get_spec
from draftsmith.train.optimizers import build_optimizer
from draftsmith.train.recipe import TrainSection
from tests.helpers.tiny_targets import tiny_target

DEPTHS = {"eagle3": {"ttt_steps": 2}, "peagle": {"num_depths": 2}}


def _frozen_head_drafter(freeze_head: bool, kind: str = "eagle3"):
    target = tiny_target("llama")
    spec = get_spec(kind)
    config = spec.make_config({"draft_vocab_size": 96, **DEPTHS[kind],
                               "freeze_head": freeze_head})
    torch.manual_seed(0)
    drafter = spec.build(target.config, config)
    drafter.init_from_target(target)
    return target, spec, config, drafter


@pytest.mark.parametrize("kind", list(DEPTHS))
def test_freeze_head_is_off_by_default_and_the_head_trains(kind):
    _, _, config, drafter = _frozen_head_drafter(False, kind)
    assert config.freeze_head is False
    assert drafter.lm_head.weight.requires_grad


@pytest.mark.parametrize("kind", list(DEPTHS))
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_frozen_head_keeps_the_targets_rows_and_the_rest_trains(optimizer, kind):
    target, spec, config, drafter = _frozen_head_drafter(True, kind)
    head_rows = target.lm_head.weight[drafter.draft_ids()].clone()
    assert not drafter.lm_head.weight.requires_grad
    assert torch.equal(drafter.lm_head.weight, head_rows)
    opt = build_optimizer(drafter, TrainSection(optimizer=optimizer, lr=1e-2))
    in_optimizer = {id(p) for group in opt.param_groups for p in group["params"]}
    assert id(drafter.lm_head.weight) not in in_optimizer
    assert id(drafter.fc.weight) in in_optimizer
    fc_before = drafter.fc.weight.detach().clone()
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(2, 128, (2, 16), generator=gen)
    mask = torch.ones_like(input_ids)
    features = target_features(target, input_ids, mask, mask,
                               spec.aux_layers(target.config.num_hidden_layers, config))
    for _ in range(2):
        loss, _ = spec.loss(drafter, features)
        opt.zero_grad()
        loss.backward()
        assert drafter.lm_head.weight.grad is None
        opt.step()
    assert torch.equal(drafter.lm_head.weight, head_rows)
    assert not torch.equal(drafter.fc.weight, fc_before)
    saved = drafter.state_dict()
    assert torch.equal(saved["lm_head.weight"], head_rows)
    assert not "lm_head.".startswith(spec.frozen_prefixes)  # never left out of a saved drafter
