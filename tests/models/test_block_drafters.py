"""DFlash and DSpark: default layer ids and mask token, anchors, position weights, the chunked
training attention against one big chunk (loss and gradients), and training-time blocks equal to
decode-time blocks (the context cache, positions and masks agree)."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.models import block_layers
from draftsmith.models.block_loss import draw_anchors, position_weights
from draftsmith.models.dflash import DFlashConfig, dflash_layer_ids, resolve_mask_token
from draftsmith.models.features import target_features
from draftsmith.registry import get_spec
from tests.helpers.tiny_targets import tiny_config, tiny_target

KINDS = {"dflash": {"block_size": 4, "num_layers": 2},
         "dspark": {"block_size": 3, "num_layers": 2, "markov_rank": 8}}


def build(kind, target, seed=1, **extra):
    spec = get_spec(kind)
    torch.manual_seed(seed)
    module = spec.build(target.config, spec.make_config({**KINDS[kind], **extra}))
    module.init_from_target(target)
    for param in module.parameters():  # random drafters are near-uniform: sharpen them
        if param.requires_grad and param.dim() == 2:
            param.data *= 3
    return module


def batch(target, length=24, prompt=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, target.config.vocab_size, (2, length), generator=generator)
    attention = torch.ones_like(ids)
    attention[1, -5:] = 0  # right padding
    loss_mask = attention.clone()
    loss_mask[:, :prompt] = 0
    return ids, attention, loss_mask


def test_default_layer_ids_follow_the_reference_and_spread_on_shallow_targets():
    assert dflash_layer_ids(30, 5) == [1, 8, 14, 20, 27]  # SmolLM2 (REFERENCE 7.1.1)
    assert dflash_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B
    assert dflash_layer_ids(30, 1) == [15]
    assert dflash_layer_ids(4, 5) == [0, 1, 2]  # the rule would repeat layer 1
    with pytest.raises(DraftsmithError, match="num_hidden_layers=1"):
        dflash_layer_ids(1, 2)


def test_layer_ids_reaching_the_last_layer_are_refused():
    target = tiny_target("llama")
    with pytest.raises(DraftsmithError, match=r"target_layer_ids \[0, 3\].*0\.\.2"):
        build("dflash", target, target_layer_ids=[0, 3])


def test_mask_token_is_the_chosen_one_else_the_config_s_eos_or_pad():
    config = tiny_config("llama")  # pad 0, eos 1
    assert resolve_mask_token(config, 100) == 100
    assert resolve_mask_token(config, None) == 1
    config.eos_token_id = None
    assert resolve_mask_token(config, None) == 0
    with pytest.raises(DraftsmithError, match=r"outside the target.s vocabulary 0\.\.127"):
        resolve_mask_token(config, 128)


def test_anchors_are_sorted_distinct_trained_positions():
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1, 1, 1], [0, 1, 1, 0, 0, 0, 0, 0, 0, 0]])
    attention = torch.ones_like(loss_mask)
    anchors, valid = draw_anchors(loss_mask, attention, 4, torch.Generator().manual_seed(0))
    assert anchors.shape == (2, 4)
    first = anchors[0][valid[0]].tolist()
    assert len(first) == 4 and first == sorted(set(first))
    assert set(first) <= {2, 3, 4, 7, 8}  # the token and the next one both trained
    assert anchors[1][valid[1]].tolist() == [1] and valid[1].sum() == 1
    many, ok = draw_anchors(loss_mask, attention, 50)
    assert many.shape[1] == 5 and ok[0].all()  # capped at the most valid positions in a row


def test_position_weights_by_hand():
    config = DFlashConfig(block_size=4, decay_gamma=2.0)
    trained = torch.tensor([[[True, True, False]]])
    prob = torch.tensor([[[0.5, 0.2, 0.9]]])
    decay = position_weights(config, "decay", trained, prob)
    assert torch.allclose(decay, torch.tensor([[[1.0, math.exp(-0.5), 0.0]]]))
    dpace = position_weights(config, "dpace", trained, prob)
    c0, c1 = 0.75, 0.75 * 0.6  # C_j = prod (0.5 q + 0.5); w_j = sum_{m >= j} C_m
    assert torch.allclose(dpace, torch.tensor([[[c0 + c1, c1, 0.0]]]))


@pytest.mark.parametrize("kind", list(KINDS))
def test_chunked_training_attention_equals_one_chunk(kind, monkeypatch):
    target = tiny_target("llama")
    ids, attention, loss_mask = batch(target)
    spec = get_spec(kind)

    def loss_and_grads(chunk_scores):
        monkeypatch.setattr(block_layers, "CHUNK_SCORES", chunk_scores)
        module = build(kind, target)
        features = target_features(target, ids, attention, loss_mask,
                                   spec.aux_layers(4, module.config))
        torch.manual_seed(5)
        loss, _ = spec.loss(module, features)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in module.named_parameters() if p.requires_grad}

    whole, whole_grads = loss_and_grads(1 << 40)
    chunked, chunked_grads = loss_and_grads(1)  # one block per chunk, recomputed in backward
    assert torch.allclose(whole, chunked, atol=1e-6)
    for name, grad in whole_grads.items():
        assert grad is not None and grad.abs().sum() > 0, name
        assert torch.allclose(grad, chunked_grads[name], atol=1e-5), name


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_training_blocks_equal_decode_time_blocks(kind, family):
    """A block drawn in training and the same anchor's block at decode time (context cache fed
    with the features of every earlier position) have the same hidden states."""
    target = tiny_target(family)
    module = build(kind, target).eval()
    ids, attention, loss_mask = batch(target)
    spec = get_spec(kind)
    features = target_features(target, ids, attention, loss_mask, spec.aux_layers(4, module.config))
    anchors = torch.tensor([[3, 9, 15], [1, 7, 12]])
    with torch.no_grad():
        trained = module.train_hidden(features, anchors)  # (2, 3, B, H)
        for row in range(2):
            fused = module.fuse([aux[row] for aux in features.aux_hidden])
            for column, anchor in enumerate(anchors[row].tolist()):
                context = block_layers.ContextCache(module.block_size)
                for part in torch.arange(anchor).split(2):  # appended in pieces, as decoding does
                    context.append(module.context_kv(fused[part], part))
                decoded = module.draft_block(ids[row, anchor], context)
                expected = trained[row, column, 1 - module.label_shift:]
                assert torch.allclose(decoded, expected, atol=1e-5), (row, anchor)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_init_from_data_rescales_each_layer_and_drops_massive_dimensions(kind):
    target = tiny_target("llama")
    module = build(kind, target)
    ids, attention, loss_mask = batch(target)
    features = target_features(target, ids, attention, loss_mask, module.target_layer_ids)
    hidden = target.config.hidden_size
    features.aux_hidden[0][:, :, 3] = 1e4  # a massive dimension at every position
    module.init_from_data(features)
    weight = module.fc.weight.detach()
    k = len(module.target_layer_ids)
    blocks = weight.view(hidden, k, hidden).transpose(0, 1)  # layer j's (H, H) block
    for j, block in enumerate(blocks):
        assert torch.equal(block, torch.diag(block.diagonal()))  # a per-dimension rescaling
        rows = features.aux_hidden[j][attention.bool() & (torch.arange(24) > 0)]
        expected = 1 / (rows.abs().median(0).values + 1e-3) / k
        if j == 0:
            assert block[3, 3] == 0  # the massive dimension is dropped
            expected[3] = 0
        torch.testing.assert_close(block.diagonal(), expected)
    for layer in module.layers:  # each layer starts as the identity
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
    # every rank starts from the same weights: each layer's statistics are averaged over processes
    seen = []
    again = build(kind, target)
    again.init_from_data(features, lambda t: seen.append(t.shape) or t)
    assert seen == [(2 * hidden + 1,)] * k  # one collective per layer: ordinary, scale, count
    torch.testing.assert_close(again.fc.weight, module.fc.weight)


def reduced_dflash(target, kept):
    """A DFlash drafter whose draft vocabulary is `kept` (sorted target ids)."""
    module = get_spec("dflash").build(target.config, get_spec("dflash").make_config(
        {**KINDS["dflash"], "draft_vocab_size": len(kept)}))
    t2d = torch.zeros(target.config.vocab_size, dtype=torch.bool).index_fill(0, kept, True)
    module.set_draft_vocab(kept - torch.arange(len(kept)), t2d)
    module.init_from_target(target)
    return module


def test_a_draft_vocabulary_keeps_the_targets_head_rows_and_restricts_the_loss():
    """With Vd of V tokens the head is the target's rows of those tokens; decoding logits are
    the target-vocabulary logits with -inf elsewhere; the loss is the soft cross-entropy against
    the target's distribution renormalised over the draft vocabulary, rows whose target choice
    lies outside it left out and counted as misses."""
    target = tiny_target("llama")
    kept = torch.randperm(128, generator=torch.Generator().manual_seed(4))[:40].sort().values
    module = reduced_dflash(target, kept)
    head = target.get_output_embeddings().weight
    assert torch.equal(module.lm_head.weight, head[kept])
    hidden = torch.randn(3, target.config.hidden_size)
    logits = module.logits(hidden)
    assert logits.shape == (3, 128)
    assert torch.allclose(logits[:, kept], hidden @ head[kept].T, atol=1e-5)
    outside = torch.ones(128, dtype=torch.bool).index_fill(0, kept, False)
    assert torch.isinf(logits[:, outside]).all()

    ids, attention, loss_mask = batch(target)
    spec = get_spec("dflash")
    features = target_features(target, ids, attention, loss_mask,
                               spec.aux_layers(4, module.config))
    module.eval()  # evaluation draws the same anchors every time
    loss, metrics = spec.loss(module, features)
    from draftsmith.models.block_loss import block_trained

    generator = torch.Generator().manual_seed(0)
    anchors, valid = draw_anchors(loss_mask, attention, module.config.anchors_per_sequence,
                                  generator)
    trained = block_trained(loss_mask, anchors, valid, module.proposals)
    positions = anchors[..., None] + torch.arange(1, module.proposals + 1)
    rows = module.train_hidden(features, anchors)[:, :, 1:][trained]
    batch_index = torch.arange(2)[:, None, None].expand(trained.shape)[trained]
    teacher = features.logits_at(batch_index, positions[trained] - 1).float()
    in_vocab = module.t2d[teacher.argmax(-1)]
    assert 0 < in_vocab.sum() < in_vocab.numel()  # both cases occur
    logp = torch.log_softmax(rows @ head[kept].T, -1)
    per_row = -(torch.softmax(teacher[:, kept], -1) * logp).sum(-1)
    gamma = module.config.decay_gamma or 2.0  # default_gamma(4)
    weights = torch.exp(-torch.arange(3.0) / gamma).expand(trained.shape)[trained] * in_vocab
    assert torch.allclose(loss, (per_row * weights).sum() / weights.sum(), atol=1e-5)
    hits = (kept[logp.argmax(-1)] == teacher.argmax(-1)) & in_vocab
    proposal = torch.arange(3).expand(trained.shape)[trained]
    assert torch.isclose(metrics["acc_0"], hits[proposal == 0].float().mean())


def test_dspark_refuses_a_draft_vocabulary():
    with pytest.raises(DraftsmithError, match=r"DSpark.s Markov head"):
        get_spec("dspark").make_config({"draft_vocab_size": 64})
