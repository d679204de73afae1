"""P-EAGLE's module and loss: its parts beside EAGLE-3's, the mask token, COD sampling's counts and
nesting, the collate's draw (the same for the same batch, so a resumed run draws alike) and the
loss reading it, the one-forward decode step against the training forward position by position,
and the loss finite, with gradients into every trained part, falling on a tiny overfit."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.models.features import kind_rows_of, target_features
from draftsmith.models.peagle import cod_anchors, cod_rows, depth_states, peagle_loss
from draftsmith.registry import get_spec
from draftsmith.train.batching import collate
from tests.helpers.tiny_targets import tiny_target

SPEC = get_spec("peagle")


def build(target, **settings):
    torch.manual_seed(0)
    module = SPEC.build(target.config, SPEC.make_config({"draft_vocab_size": 100, **settings}))
    module.init_from_target(target)
    return module


def features_of(target, module, sequence, loss_mask=None):
    mask = torch.ones_like(sequence)
    layers = SPEC.aux_layers(target.config.num_hidden_layers, module.config)
    return target_features(target, sequence, mask, mask if loss_mask is None else loss_mask,
                           layers)


def test_parts_are_eagle3_plus_mask_hidden():
    target = tiny_target("llama")
    module = build(target, num_depths=4)
    eagle3 = get_spec("eagle3").build(target.config, get_spec("eagle3").make_config(
        {"draft_vocab_size": 100}))
    extra = set(module.state_dict()) - set(eagle3.state_dict())
    assert extra == {"mask_hidden"}
    assert module.mask_hidden.shape == (1, 1, 3 * target.config.hidden_size)
    assert module.config.mask_token_id == target.config.eos_token_id  # recorded once built
    assert module.proposals == 4
    assert build(target, mask_token_id=77).config.mask_token_id == 77


def test_bad_settings_name_the_setting():
    target = tiny_target("llama")
    with pytest.raises(DraftsmithError, match="mask_token_id 500 is outside"):
        build(target, mask_token_id=500)
    for key, value in (("cod_ratio", 0.0), ("cod_min_ratio", 1.5), ("num_depths", 0)):
        with pytest.raises(DraftsmithError, match=key):
            SPEC.make_config({key: value})


def test_cod_sampling_keeps_the_peers_counts_nested_in_trained_positions():
    torch.manual_seed(0)
    t, depths = 40, 6
    lengths = torch.tensor([40, 25, 12])
    loss_mask = (torch.arange(t)[None] < lengths[:, None]).long()
    index = torch.arange(t)[None]
    valid = [(torch.roll(loss_mask, -(2 + d), 1) > 0) & (index < t - 2 - d)
             for d in range(depths)]
    chosen = cod_anchors(valid, 0.7, 0.2)
    seeds = valid[0].sum(1)
    for d in range(1, depths):
        assert bool((chosen[d] <= chosen[d - 1]).all()) and bool((chosen[d] <= valid[d]).all())
        eligible = (chosen[d - 1] & valid[d]).sum(1)
        wanted = [math.floor((int(n) - d) * max(0.7 ** d, 0.2)) for n in seeds]
        assert chosen[d].sum(1).tolist() == [min(w, int(e)) for w, e in zip(wanted, eligible,
                                                                             strict=True)]
    # the survivors differ from draw to draw (a random subset, not a prefix)
    again = cod_anchors(valid, 0.7, 0.2)
    assert any(not torch.equal(x, y) for x, y in zip(chosen[1:], again[1:], strict=True))


def test_the_collate_draws_the_cod_rows_per_batch_and_the_loss_reads_them():
    target = tiny_target("llama")
    module = build(target, num_depths=3)
    examples = [{"input_ids": list(range(2, 30)), "loss_mask": [0] * 6 + [1] * 22},
                {"input_ids": list(range(5, 20)), "loss_mask": [0] * 4 + [1] * 11}]
    draw = functools.partial(SPEC.collate_rows, module.config, 7)
    batch = collate(examples, 64, draw)
    rows = kind_rows_of(batch)
    assert set(rows) == {"packed", "scored", "anchors.0", "anchors.1", "anchors.2"}
    # the same batch draws the same rows (a resumed run), another seed others
    assert all(torch.equal(rows[k], kind_rows_of(collate(examples, 64, draw))[k]) for k in rows)
    other = kind_rows_of(collate(examples, 64, functools.partial(SPEC.collate_rows,
                                                                 module.config, 8)))
    assert any(not torch.equal(rows[k], other[k]) for k in ("anchors.1", "anchors.2"))
    # nested, ascending, depth 0's anchors found inside the packed rows
    assert torch.equal(rows["packed"][rows["scored"]], rows["anchors.0"])
    for d in (1, 2):
        assert set(rows[f"anchors.{d}"].tolist()) <= set(rows[f"anchors.{d - 1}"].tolist())
        assert torch.equal(rows[f"anchors.{d}"], rows[f"anchors.{d}"].sort().values)
    layers = SPEC.aux_layers(target.config.num_hidden_layers, module.config)
    feats = target_features(target, batch["input_ids"], batch["attention_mask"],
                            batch["loss_mask"], layers, kind_rows=rows)
    loss, _ = SPEC.loss(module, feats)
    again, _ = peagle_loss(module, batch["input_ids"], batch["attention_mask"],
                           batch["loss_mask"], feats.aux_hidden, feats, rows)
    assert torch.isfinite(loss) and torch.equal(loss, again)


@pytest.mark.parametrize("family, settings", [("llama", {}), ("qwen2", {"fc_norm": True,
                                                                         "norm_output": True})])
def test_one_decode_forward_equals_the_training_forward_at_every_depth(family, settings):
    """Anchor a at depth d in training (packed rows, TTT attention) and slot d of the decode
    forward whose last real row is a (dense causal mask, a cache split in two) agree."""
    target = tiny_target(family)
    module = build(target, num_depths=4, **settings).eval()
    sequence = torch.randint(2, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    feats = features_of(target, module, sequence)
    t, depths = sequence.shape[1], module.proposals
    everything = [torch.ones(1, t, dtype=torch.bool)] * depths
    with torch.no_grad():
        rows = cod_rows(torch.ones_like(sequence), everything)
        trained = dict(depth_states(module, sequence, feats.aux_hidden, rows, depths))
        fused = module.fuse(feats.aux_hidden)[0]
        tokens = torch.cat([sequence[0, 1:], sequence.new_zeros(1)])
        _, past = module.draft_parallel(tokens[:6], fused[:6], torch.arange(6), None, 1)
        for anchor in (9, 14):
            states, _ = module.draft_parallel(tokens[6:anchor + 1], fused[6:anchor + 1],
                                              torch.arange(6, anchor + 1), past, depths)
            for d in range(depths):
                torch.testing.assert_close(module.head(states[d]), module.head(trained[d][anchor]),
                                           rtol=1e-4, atol=1e-4)


def test_loss_is_finite_reaches_every_part_and_falls_on_a_tiny_overfit():
    target = tiny_target("llama")
    target.lm_head.weight.data *= 20  # peaked, so the soft cross-entropy can fall far
    module = build(target, num_depths=3)
    sequence = torch.randint(2, 128, (2, 24), generator=torch.Generator().manual_seed(2))
    loss_mask = torch.ones_like(sequence)
    loss_mask[:, :5] = 0
    feats = features_of(target, module, sequence, loss_mask)
    trained = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trained, lr=3e-3)
    losses = []
    for step in range(40):
        loss, metrics = peagle_loss(module, sequence, feats.attention_mask, loss_mask,
                                    feats.aux_hidden, feats)
        assert torch.isfinite(loss) and set(metrics) >= {"acc_0", "acc_2", "loss_1"}
        optimizer.zero_grad()
        loss.backward()
        if step == 0:
            names = {n for n, p in module.named_parameters() if p.requires_grad and
                     p.grad is not None and p.grad.abs().sum() > 0}
            assert "mask_hidden" in names and "fc.weight" in names and "lm_head.weight" in names
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::8]
    assert not module.embed_tokens.weight.requires_grad  # the frozen copy stays frozen
