"""The per-position losses gather the rows they train at the trained positions the collate counts
on the host (no host count in the step): in float64 each kind's loss, metrics and gradients
equal the formulation they replaced, which picked the trained rows by boolean indexing and
divided by their count. The references below are that formulation, kept here and not in the
product."""

from __future__ import annotations

import pytest
import torch

from draftsmith.models.features import target_features
from draftsmith.models.layers import shift_left
from draftsmith.models.losses import dpace_weights, label_prob, parse_loss, per_row_loss
from draftsmith.models.ttt_rows import ttt_masks
from draftsmith.registry import get_spec
from tests.helpers.drafters import small_settings
from tests.helpers.tiny_targets import tiny_target


class RowLosses:
    """The replaced PositionLosses: rows picked by boolean indexing, D-PACE on a flat grid."""

    def __init__(self, spec, scheme, weights, size):
        self.spec, self.scheme, self.weights, self.size = spec, scheme, weights, size
        self.sum, self.depths = 0.0, []

    def add(self, k, logp, teacher, valid, missed=None, tokens=None):
        count = valid.sum().clamp_min(1)
        flat = valid.flatten().nonzero().squeeze(1)
        if tokens is None:
            rows = per_row_loss(logp, teacher, self.spec)
            prob = label_prob(logp, teacher)
        else:
            rows = -logp.gather(-1, tokens[:, None]).squeeze(-1)
            prob = (-rows).detach().exp()
        if self.scheme != "dpace":
            self.sum = self.sum + self.weights[k] * rows.sum() / count
        else:
            lost = None if missed is None else missed.flatten().nonzero().squeeze(1)
            self.depths.append((rows, count, flat, prob, lost))
        return (rows.sum() / count).detach()

    def total(self):
        if self.scheme != "dpace":
            return self.sum
        q = torch.zeros(len(self.depths), self.size, dtype=torch.float64)
        mask = torch.zeros(len(self.depths), self.size, dtype=torch.bool)
        known = mask.clone()
        for j, (_, _, flat, prob, lost) in enumerate(self.depths):
            q[j, flat], mask[j, flat], known[j, flat] = prob, True, True
            if lost is not None:
                known[j, lost] = True
        w = dpace_weights(q, mask, known)
        return self.sum + sum((w[j, flat] * rows).sum() / count
                              for j, (rows, count, flat, _, _) in enumerate(self.depths))


def _batch(b=3, t=20):
    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(2, 128, (b, t), generator=gen)
    attention_mask = torch.ones(b, t, dtype=torch.long)
    attention_mask[1, 13:] = 0
    attention_mask[2, 8:] = 0
    loss_mask = attention_mask.clone()
    loss_mask[0, :1] = 0  # a one-token prompt: rows before a sequence's start are gathered (and
    # masked) at flat position 0, where row 0's trained rows are too
    loss_mask[1, :9] = 0
    loss_mask[0, 9:11] = 0  # a second user turn
    return input_ids * attention_mask, attention_mask, loss_mask


def _weights(cfg, count, attr):
    from draftsmith.models.losses import decay_weights
    if cfg.position_weights != "geometric":
        return decay_weights(count, cfg.decay_gamma)
    return [getattr(cfg, attr) ** k for k in range(count)]


def old_medusa(heads, ids, loss_mask, feats, logits):
    cfg, (b, t) = heads.config, ids.shape
    index = torch.arange(t)[None]
    n = len(heads.heads)
    losses = RowLosses(parse_loss(cfg.loss), cfg.position_weights,
                       _weights(cfg, n, "head_weight"), b * t)
    for k in range(n):
        valid = (shift_left(loss_mask, 2 + k) > 0) & (index < t - 2 - k)
        out = heads.head(k, feats[valid]).double()
        tokens = shift_left(ids, 2 + k)[valid] if cfg.labels == "data" else None
        losses.add(k, out.log_softmax(-1), shift_left(logits, 1 + k)[valid], valid, tokens=tokens)
    return losses.total()


def old_mtp(drafter, ids, attention_mask, loss_mask, feats, logits):
    from draftsmith.models.layers import padded_causal_mask
    cfg, (b, t) = drafter.config, ids.shape
    positions = torch.arange(t)[None].expand(b, t)
    w = _weights(cfg, cfg.num_modules, "step_weight")
    w = [x / sum(w) for x in w] if cfg.position_weights == "geometric" else w
    losses = RowLosses(parse_loss(cfg.loss), cfg.position_weights, w, b * t)
    hidden = feats
    for k in range(cfg.num_modules):
        hidden, _ = drafter.module_hidden(k, shift_left(ids, k + 1), hidden, positions,
                                          padded_causal_mask(attention_mask))
        valid = (shift_left(loss_mask, k + 2) > 0) & (positions < t - k - 2)
        out = drafter.module_logits(k, hidden[valid]).double()
        tokens = shift_left(ids, k + 2)[valid] if cfg.labels == "data" else None
        losses.add(k, out.log_softmax(-1), shift_left(logits, k + 1)[valid], valid, tokens=tokens)
    return losses.total()


def old_eagle1(drafter, ids, attention_mask, loss_mask, feats, logits):
    from draftsmith.models.layers import padded_causal_mask
    cfg, (b, t) = drafter.config, ids.shape
    positions = torch.arange(t)[None].expand(b, t)
    predicted, _ = drafter.step(shift_left(ids, 1), feats, positions,
                                padded_causal_mask(attention_mask))
    valid = (shift_left(loss_mask, 2) > 0) & (positions < t - 2)
    count = valid.sum().clamp_min(1)
    feature = torch.nn.functional.smooth_l1_loss(predicted[valid], shift_left(feats, 1)[valid],
                                                 reduction="none").mean(-1).sum() / count
    logp = drafter.logits(predicted[valid]).double().log_softmax(-1)
    token = per_row_loss(logp, shift_left(logits, 1)[valid], parse_loss(cfg.loss)).sum() / count
    return cfg.feature_weight * feature + cfg.token_weight * token


def old_eagle3(drafter, ids, attention_mask, loss_mask, aux, logits):
    cfg, (b, t) = drafter.config, ids.shape
    positions = torch.arange(t)[None].expand(b, t)
    draft_ids = drafter.draft_ids()
    masks = ttt_masks(attention_mask, cfg.ttt_steps)
    losses = RowLosses(parse_loss(cfg.loss), cfg.position_weights,
                       _weights(cfg, cfg.ttt_steps, "step_weight"), b * t)
    hidden, cache = drafter.fuse(aux), []
    for j in range(cfg.ttt_steps):
        out, kv = drafter.step(shift_left(ids, 1 + j), hidden, positions + j, masks[j],
                               extra_kv=cache, with_logits=False)
        cache, hidden = [*cache, kv], out
        valid = (shift_left(loss_mask, 2 + j) > 0) & (positions < t - 2 - j)
        after = shift_left(logits, 1 + j)
        in_vocab = drafter.t2d[after.argmax(-1)]
        scored = valid & in_vocab
        logp = drafter.head(out[scored]).double().log_softmax(-1)
        losses.add(j, logp, after[scored][:, draft_ids], scored, missed=valid & ~in_vocab)
    return losses.total()


OLD = {"medusa": old_medusa, "mtp": old_mtp, "eagle1": old_eagle1, "eagle3": old_eagle3}
SETTINGS = [{}, {"position_weights": "dpace", "loss": {"ce": 0.2, "lk": 0.8}},
            {"position_weights": "decay", "loss": "tv"}, {"labels": "data"},
            {"labels": "data", "position_weights": "dpace"}]
CASES = [pytest.param(kind, extra, id=f"{kind}-{i}") for kind in OLD
         for i, extra in enumerate(SETTINGS)
         if not ("labels" in extra and kind not in ("medusa", "mtp"))
         and not (kind == "eagle1" and extra.get("position_weights"))]


@pytest.mark.parametrize("kind, extra", CASES)
def test_masked_loss_and_gradients_equal_the_boolean_indexed_ones_in_float64(kind, extra):
    target = tiny_target("llama", dtype=torch.float64)
    target.lm_head.weight.data *= 10
    spec = get_spec(kind)
    config = spec.make_config({**small_settings(kind), **extra})
    torch.manual_seed(0)
    drafter = spec.build(target.config, config).double().eval()  # EAGLE-1: no feature noise
    drafter.init_from_target(target)
    for param in drafter.parameters():  # away from the zero-ish start, so every term matters
        if param.requires_grad and param.dim() == 2:
            param.data *= 3
    ids, attention_mask, loss_mask = _batch()
    feats = target_features(target, ids, attention_mask, loss_mask,
                            spec.aux_layers(target.config.num_hidden_layers, config))
    params = [p for p in drafter.parameters() if p.requires_grad]
    loss, metrics = spec.loss(drafter, feats)
    feature = feats.aux_hidden if kind == "eagle3" else feats.last_hidden
    if kind == "medusa":
        expected = old_medusa(drafter, ids, loss_mask, feature, feats.target_logits)
    else:
        expected = OLD[kind](drafter, ids, attention_mask, loss_mask, feature, feats.target_logits)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad(loss, params)
    expected_grads = torch.autograd.grad(expected, params)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-12)
    assert loss > 0 and any(g.abs().sum() > 0 for g in grads)
    assert all(isinstance(v, torch.Tensor) for v in metrics.values())
