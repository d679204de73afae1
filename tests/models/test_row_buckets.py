"""Row buckets (models/row_buckets.py): every kind's training step computes the same loss and
gradients with its linears' row counts rounded up, reads nothing from the host for it, and keeps
its parameters and state dict; the training setting chooses the multiple by device."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from draftsmith.errors import DraftsmithError
from draftsmith.models.features import target_features
from draftsmith.models.layers import next_trained_rows
from draftsmith.models.row_buckets import DEFAULT_MULTIPLE, bucket_rows
from draftsmith.registry import get_spec
from draftsmith.train.recipe import TrainSection
from tests.helpers.drafters import training_cases
from tests.helpers.tiny_targets import tiny_target
from tests.train.test_host_reads import HostReads, _batch


def _step(drafter, spec, features):
    drafter.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # EAGLE-1's feature noise draws the same
    loss, _ = spec.loss(drafter, features)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("kind, settings", training_cases())
def test_bucketed_rows_give_the_same_loss_and_gradients(kind, settings):
    target = tiny_target("llama").double()
    spec = get_spec(kind)
    config = spec.make_config(settings)
    torch.manual_seed(0)
    drafter = spec.build(target.config, config).double()
    drafter.init_from_target(target)
    input_ids, attention_mask, loss_mask = _batch()
    rows = spec.collate_rows(config, 0, input_ids, attention_mask, loss_mask) \
        if spec.collate_rows else None

    def features():
        return target_features(target, input_ids, attention_mask, loss_mask,
                               spec.aux_layers(target.config.num_hidden_layers, config),
                               next_trained_rows(loss_mask), rows)

    plain_loss, plain_grads = _step(drafter, spec, features())
    bucketed = copy.deepcopy(drafter)
    assert bucket_rows(bucketed, 7) > 0  # 7: no row count of this batch is a multiple
    again = features()  # the collate's and the target's work, before counting
    with HostReads() as reads:
        loss, grads = _step(bucketed, spec, again)
    assert sum(reads.counts.values()) == 0, dict(reads.counts)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-12, atol=1e-12)
    assert grads.keys() == plain_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-10, atol=1e-12,
                                   msg=f"{kind}: gradient of {name}")


def test_the_hooks_pad_and_slice_any_leading_shape():
    linear = nn.Linear(5, 3).double()
    plain = copy.deepcopy(linear)
    assert bucket_rows(linear, 4) == 1 and bucket_rows(linear, 4) == 1  # twice: one pair of hooks
    assert len(linear._forward_pre_hooks) == 1 and len(linear._forward_hooks) == 1
    seen = []
    linear.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    for shape in ((3, 5), (2, 3, 5), (8, 5), (0, 5)):
        x = torch.randn(*shape, dtype=torch.float64)
        out = linear(x)
        assert out.shape == (*shape[:-1], 3)
        torch.testing.assert_close(out, plain(x))
    assert seen == [4, 8, 8, 0]  # 3 -> 4 and 6 -> 8 rows; 8 and 0 as they are
    assert linear.state_dict().keys() == plain.state_dict().keys()
    assert bucket_rows(nn.Linear(2, 2), 1) == 0


def test_the_setting_chooses_the_multiple_by_device():
    auto = TrainSection()
    assert auto.row_multiple("cpu", "bf16") == DEFAULT_MULTIPLE == 64
    assert auto.row_multiple("cpu", "no") == 1  # float32: MKL builds nothing per shape
    assert auto.row_multiple("cuda", "bf16") == 1
    assert TrainSection(bucket_rows=1).row_multiple("cpu", "bf16") == 1
    assert TrainSection(bucket_rows=128).row_multiple("cuda", "no") == 128
    with pytest.raises(DraftsmithError, match=r"train\.bucket_rows=0 must be >= 1"):
        TrainSection(bucket_rows=0)
