"""Every registered drafter trains on tiny random targets of each family: loss finite and falling,
every drafter parameter moves, the target never does. Shared over the registry, so a new kind is
tested without new test code."""

from __future__ import annotations

import pytest
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.models.features import target_features
from draftsmith.registry import get_spec
from tests.helpers.drafters import small_settings, training_cases
from tests.helpers.tiny_targets import FAMILIES, tiny_target


def _batch(seed=0, b=2, t=24):
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, 128, (b, t), generator=gen)
    attention_mask = torch.ones(b, t, dtype=torch.long)
    attention_mask[1, -5:] = 0  # right padding in the second row
    loss_mask = attention_mask.clone()
    loss_mask[:, :6] = 0  # a "prompt" that is not trained on
    return input_ids, attention_mask, loss_mask


def build(kind, family, settings=None):
    target = tiny_target(family)
    # A random tiny target is nearly uniform, so soft cross-entropy against it has a floor close
    # to log V; a sharper head gives the drafter something to learn.
    target.lm_head.weight.data *= 40
    spec = get_spec(kind)
    config = spec.make_config(small_settings(kind) if settings is None else settings)
    torch.manual_seed(0)
    drafter = spec.build(target.config, config)
    drafter.init_from_target(target)
    return target, spec, config, drafter


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind, settings", training_cases())
def test_drafter_learns_a_fixed_batch_and_leaves_the_target_alone(kind, settings, family):
    target, spec, config, drafter = build(kind, family, settings)
    before_target = {n: p.clone() for n, p in target.named_parameters()}
    trainable = {n: p for n, p in drafter.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in trainable.items()}
    frozen_before = {n: p.clone() for n, p in drafter.named_parameters() if not p.requires_grad}
    assert trainable, "a drafter must have trainable parameters"
    input_ids, attention_mask, loss_mask = _batch()
    features = target_features(target, input_ids, attention_mask, loss_mask,
                               spec.aux_layers(target.config.num_hidden_layers, config))
    optimizer = torch.optim.AdamW(trainable.values(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss, metrics = spec.loss(drafter, features)
        assert torch.isfinite(loss) and "acc_0" in metrics
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    for name, param in trainable.items():
        assert not torch.equal(param, before[name]), f"{name} did not change"
    for name, param in target.named_parameters():
        assert torch.equal(param, before_target[name]), f"target {name} changed"
    frozen = [n for n, p in drafter.named_parameters() if not p.requires_grad]
    assert all(n.startswith(spec.frozen_prefixes) for n in frozen)
    for name, param in drafter.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, frozen_before[name]), f"frozen copy {name} changed"


def test_medusa_shared_head_trains_the_resblocks_through_the_targets_head():
    """shared_head: the heads' only trainable tensors are their ResBlocks; one frozen copy of the
    target's output layer gives every head its logits (head k = lm_head(ResBlocks_k(h)))."""
    settings = {"num_heads": 3, "num_layers": 2, "shared_head": True}
    target, _, _, heads = build("medusa", "llama", settings)
    own = build("medusa", "llama", {**settings, "shared_head": False})[3]
    trainable = {n for n, p in heads.named_parameters() if p.requires_grad}
    assert trainable == {f"heads.{k}.{j}.linear.{part}" for k in range(3) for j in range(2)
                         for part in ("weight", "bias")}
    hidden_size, vocab = target.config.hidden_size, target.config.vocab_size
    count = sum(p.numel() for p in heads.parameters() if p.requires_grad)
    assert count == 3 * 2 * (hidden_size * hidden_size + hidden_size)
    assert sum(p.numel() for p in own.parameters() if p.requires_grad) == \
        count + 3 * vocab * hidden_size
    torch.testing.assert_close(heads.lm_head.weight, target.lm_head.weight)
    for block in heads.heads:  # non-zero ResBlocks, so the head is more than the target's head
        for res in block:
            res.linear.weight.data.normal_(0, 0.3)
    hidden = torch.randn(1, 5, hidden_size)
    for k, logits in enumerate(heads(hidden)):
        torch.testing.assert_close(logits, target.lm_head(heads.heads[k](hidden)))
    with pytest.raises(DraftsmithError, match="shared_head=true trains the ResBlocks only"):
        get_spec("medusa").make_config({"shared_head": True, "num_layers": 0})


@pytest.mark.parametrize("shared_head", [False, True])
def test_medusa_heads_start_as_the_target_head(shared_head):
    target, _, _, heads = build("medusa", "llama", {"num_heads": 2, "shared_head": shared_head})
    hidden = torch.randn(1, 5, 32)
    for head_logits in heads(hidden):
        torch.testing.assert_close(head_logits, target.lm_head(hidden))


def test_unknown_setting_names_the_valid_ones():
    with pytest.raises(DraftsmithError, match="ttt_steps"):
        get_spec("eagle3").make_config({"ttt_stepz": 3})
    with pytest.raises(DraftsmithError, match="medusa"):
        get_spec("eagle4")


@pytest.mark.parametrize("kind, settings", training_cases())
def test_fp32_drafter_trains_on_bf16_target_features(kind, settings):
    target = tiny_target("qwen2", dtype=torch.bfloat16)
    spec = get_spec(kind)
    config = spec.make_config(settings)
    drafter = spec.build(target.config, config)
    drafter.init_from_target(target)
    input_ids, attention_mask, loss_mask = _batch()
    features = target_features(target, input_ids, attention_mask, loss_mask,
                               spec.aux_layers(target.config.num_hidden_layers, config))
    assert features.last_hidden.dtype == torch.bfloat16
    loss, _ = spec.loss(drafter, features)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in drafter.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_label_sources_of_medusa_and_mtp():
    """labels: target is soft cross-entropy against the target's distribution (hand-computed
    here), labels: data is cross-entropy on the data's tokens; anything else is refused."""
    from draftsmith.models.losses import PositionLosses, parse_loss

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
    teacher = torch.tensor([[0.0, 3.0, 0.0], [1.0, 0.0, 0.0]])
    tokens = torch.tensor([0, 2])
    p = teacher.softmax(-1)
    logp = logits.log_softmax(-1)
    one = torch.tensor(1)
    target = PositionLosses(parse_loss("kl"), "geometric", [1.0], 2, torch.device("cpu"))
    torch.testing.assert_close(target.add(0, logp, teacher, one), -(p * logp).sum())
    data = PositionLosses(parse_loss("kl"), "geometric", [1.0], 2, torch.device("cpu"))
    torch.testing.assert_close(data.add(0, logp, teacher, one, tokens=tokens),
                               torch.nn.functional.cross_entropy(logits, tokens, reduction="sum"))
    for kind in ("medusa", "mtp"):
        assert get_spec(kind).make_config().labels == "target"
        with pytest.raises(DraftsmithError, match="labels='gold': use one of target, data"):
            get_spec(kind).make_config({"labels": "gold"})
