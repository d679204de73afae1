"""Draft losses and position weights (models/losses.py) against hand-computed values and a plain
per-element reference, gradients included; every kind with a `loss` setting trains with each."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.models.features import target_features
from draftsmith.models.losses import (
    LK_DECAY,
    PositionLosses,
    decay_weights,
    dpace_weights,
    parse_loss,
    per_row_loss,
    summed_loss,
)
from draftsmith.registry import DRAFTERS, get_spec
from draftsmith.train.recipe import build_recipe
from tests.helpers.drafters import small_settings
from tests.helpers.tiny_targets import tiny_target

LN2 = math.log(2)
# p = (0.5, 0.25, 0.25), q = (0.25, 0.25, 0.5): alpha = 0.75, KL(p||q) = ln2 / 4,
# -sum p log q = 1.75 ln2, CE on argmax p (column 0) = 2 ln2
P = torch.tensor([[0.5, 0.25, 0.25]])
Q = torch.tensor([[0.25, 0.25, 0.5]])


def _rows(loss) -> float:
    return float(per_row_loss(Q.log(), P.log(), parse_loss(loss))[0])


def test_each_loss_on_hand_computed_distributions():
    assert _rows("kl") == pytest.approx(1.75 * LN2)
    assert _rows("tv") == pytest.approx(0.25)
    assert _rows("ce") == pytest.approx(2 * LN2)
    w = math.exp(-LK_DECAY * 0.75)
    assert _rows("lk") == pytest.approx(w * LN2 / 4 + (1 - w) * 0.25)
    assert _rows({"ce": 0.1, "tv": 0.9}) == pytest.approx(0.1 * 2 * LN2 + 0.9 * 0.25)


def _reference(draft_logits, target_logits, name):
    """A plain per-row, per-element reference of each loss."""
    rows = []
    q_all = torch.softmax(draft_logits, -1)
    alphas = [sum(torch.minimum(q_all[r, v], torch.softmax(target_logits[r], -1)[v])
                  for v in range(draft_logits.shape[1])) for r in range(draft_logits.shape[0])]
    mean_alpha = sum(float(a.detach()) for a in alphas) / len(alphas)
    for r in range(draft_logits.shape[0]):
        p = torch.softmax(target_logits[r], -1)
        q = q_all[r]
        kl = sum(p[v] * (torch.log(p[v]) - torch.log(q[v])) for v in range(len(p)))
        if name == "kl":
            rows.append(-sum(p[v] * torch.log(q[v]) for v in range(len(p))))
        elif name == "tv":
            rows.append(1 - alphas[r])
        elif name == "ce":
            rows.append(-torch.log(q[int(target_logits[r].argmax())]))
        else:
            w = math.exp(-LK_DECAY * mean_alpha)  # a constant: the mean is not differentiated
            rows.append(w * kl + (1 - w) * (1 - alphas[r]))
    return torch.stack(rows)


@pytest.mark.parametrize("name", ["kl", "tv", "ce", "lk"])
def test_losses_and_gradients_equal_a_plain_reference(name):
    g = torch.Generator().manual_seed(0)
    target = torch.randn(5, 7, generator=g, dtype=torch.float64)
    draft = torch.randn(5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    reference = draft.detach().clone().requires_grad_(True)
    ours = per_row_loss(torch.log_softmax(draft, -1), target, parse_loss(name))
    theirs = _reference(reference, target, name)
    torch.testing.assert_close(ours, theirs.to(ours.dtype))
    weights = torch.arange(1.0, 6.0, dtype=torch.float64)
    (ours * weights).sum().backward()
    (theirs * weights).sum().backward()
    assert draft.grad.abs().sum() > 0
    torch.testing.assert_close(draft.grad, reference.grad)


def test_plain_kl_is_the_former_soft_cross_entropy_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    target, draft = torch.randn(9, 33, generator=g), torch.randn(9, 33, generator=g)
    logp = torch.log_softmax(draft, -1)
    former = -(torch.softmax(target, -1) * logp).sum()
    assert torch.equal(summed_loss(logp, target, parse_loss("kl")), former)
    assert torch.equal(summed_loss(logp, target, parse_loss({"kl": 1})), former)


def test_decay_and_dpace_weights_by_hand():
    assert decay_weights(3, 2.0) == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0)])
    # one position, depths with q = 0.8, 0.6, 0.4: q~ = 0.9, 0.8, 0.7, C = 0.9, 0.72, 0.504
    q = torch.tensor([[0.8], [0.6], [0.4]], requires_grad=True)
    mask = torch.ones(3, 1, dtype=torch.bool)
    weights = dpace_weights(q, mask)
    assert not weights.requires_grad
    torch.testing.assert_close(weights[:, 0], torch.tensor([2.124, 1.224, 0.504]))
    # depth 1 a sure miss (known, q = 0, no loss): q~ = 0.5 there; depth 2 unknown: q~ = 1
    q = torch.tensor([[0.8], [0.0], [0.4]])
    known = torch.tensor([[True], [True], [False]])
    loss_at = torch.tensor([[True], [False], [False]])
    torch.testing.assert_close(dpace_weights(q, loss_at, known)[:, 0],
                               torch.tensor([0.9, 0.0, 0.0]))
    loss_at = torch.tensor([[True], [False], [True]])
    known = torch.ones(3, 1, dtype=torch.bool)
    # C = 0.9, 0.45, 0.315 -> w = 0.9 + 0.315, 0.315, 0.315
    torch.testing.assert_close(dpace_weights(q, loss_at, known)[:, 0],
                               torch.tensor([1.215, 0.315, 0.315]))


def test_position_losses_weight_rows_by_dpace_over_each_depths_count():
    g = torch.Generator().manual_seed(2)
    spec = parse_loss("ce")
    logits = [torch.randn(2, 4, generator=g, requires_grad=True) for _ in range(2)]
    targets = [torch.randn(2, 4, generator=g) for _ in range(2)]
    flats = [torch.tensor([0, 2]), torch.tensor([0, 1])]
    losses = PositionLosses(spec, "dpace", [], 3, torch.device("cpu"))
    for k in range(2):
        losses.add(k, torch.log_softmax(logits[k], -1), targets[k], torch.tensor(2), flat=flats[k])
    total = losses.total()
    # by hand: the label probabilities on a (2 depths, 3 positions) grid
    q = torch.zeros(2, 3)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    rows = []
    for k in range(2):
        logp = torch.log_softmax(logits[k], -1)
        label = targets[k].argmax(-1)
        q[k, flats[k]] = logp.detach().gather(-1, label[:, None]).squeeze(-1).exp()
        mask[k, flats[k]] = True
        rows.append(-logp.gather(-1, label[:, None]).squeeze(-1))
    w = dpace_weights(q, mask)
    expected = sum((w[k, flats[k]] * rows[k]).sum() / 2 for k in range(2))
    torch.testing.assert_close(total, expected)
    total.backward()
    assert all(x.grad is not None and x.grad.abs().sum() > 0 for x in logits)


@pytest.mark.parametrize("value, message", [
    ("kld", "unknown loss 'kld'; use one of kl, tv, lk, ce"),
    ({"tv": -1}, "weight -1 of 'tv' must be a number >= 0"),
    ({"tv": True}, "weight True of 'tv' must be a number >= 0"),
    ({"tv": 0, "ce": 0.0}, "gives every loss weight 0"),
    (3, "drafter.loss=3: use one of kl, tv, lk, ce"),
])
def test_bad_loss_settings_name_the_setting_and_the_choices(value, message):
    with pytest.raises(DraftsmithError, match=r"drafter\.loss") as err:
        build_recipe({"target": {"name": "x"}, "drafter": {"kind": "eagle3", "loss": value}})
    assert message in str(err.value)


def test_bad_position_weights_and_data_labels_are_refused():
    with pytest.raises(DraftsmithError, match="position_weights='cosine': use one of geometric, "
                       "decay, dpace"):
        get_spec("mtp").make_config({"position_weights": "cosine"})
    with pytest.raises(DraftsmithError, match="decay_gamma=0"):
        get_spec("eagle3").make_config({"position_weights": "decay", "decay_gamma": 0})
    with pytest.raises(DraftsmithError, match="labels=data trains cross-entropy on the data"):
        get_spec("medusa").make_config({"labels": "data", "loss": "tv"})


PER_POSITION_KINDS = ("eagle1", "eagle3", "mtp", "medusa")  # the kinds wired to models/losses.py


def _takes(kind: str, settings: dict) -> bool:
    """Whether the kind's config accepts these shared loss settings."""
    try:
        get_spec(kind).make_config({**small_settings(kind), **settings})
    except DraftsmithError:
        return False
    return True


def _loss_kinds() -> list:
    """Every registered kind that takes the shared `loss` setting (a mixture), with each loss;
    those that also take `position_weights: decay` with each weighting."""
    cases = []
    for kind in DRAFTERS:
        if not _takes(kind, {"loss": {"ce": 0.1, "tv": 0.9}}):
            continue
        for loss in ("tv", "lk", "ce", {"ce": 0.1, "tv": 0.9}):
            cases.append(pytest.param(kind, {"loss": loss}, id=f"{kind}-{loss}"))
        if _takes(kind, {"position_weights": "decay", "decay_gamma": 2.0}):
            for scheme in ("decay", "dpace"):
                cases.append(pytest.param(kind, {"loss": "ce", "position_weights": scheme},
                                          id=f"{kind}-ce-{scheme}"))
    return cases


def test_the_per_position_kinds_take_every_loss_and_weighting():
    ids = {case.id for case in _loss_kinds()}
    for kind in PER_POSITION_KINDS:
        assert f"{kind}-lk" in ids, kind
        if kind != "eagle1":  # one draft position: nothing to weight
            assert f"{kind}-ce-dpace" in ids, kind


@pytest.mark.parametrize("kind, settings", _loss_kinds())
def test_every_kind_trains_with_each_loss_and_weighting(kind, settings):
    spec = get_spec(kind)
    target = tiny_target("llama")
    torch.manual_seed(0)
    config = spec.make_config({**small_settings(kind), **settings})
    drafter = spec.build(target.config, config)
    drafter.init_from_target(target)
    ids = torch.randint(2, 128, (2, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    features = target_features(target, ids, mask, mask,
                               spec.aux_layers(target.config.num_hidden_layers, config))
    loss, metrics = spec.loss(drafter, features)
    assert torch.isfinite(loss) and loss > 0
    assert all(torch.isfinite(v) for v in metrics.values())
    loss.backward()
    grads = [p.grad for p in drafter.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
