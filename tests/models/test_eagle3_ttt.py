"""EAGLE-3's training-time test against a plain step-by-step reference: position by position,
step j attends to step 0's keys up to its own position and to its own position in steps 1..j.
And the loss (mask-free TTT attention, rows selected by masks) against dense-mask SDPA with the
trained rows picked by boolean indexing: same loss, metrics and gradients. `ttt_rows` (the rows
P-EAGLE's packed steps compute) is checked on its own."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.models.eagle3 import Eagle3Config, Eagle3Drafter, eagle3_loss
from draftsmith.models.features import target_features
from draftsmith.models.layers import shift_left
from draftsmith.models.ttt_rows import ttt_masks, ttt_rows
from tests.helpers.tiny_targets import tiny_target

STEPS, T = 3, 10


def _attend_reference(attn, q, keys, values):
    """Plain attention of one query over explicit key/value lists (GQA by repetition)."""
    group = attn.num_heads // attn.num_kv_heads
    k = torch.stack(keys, dim=1).repeat_interleave(group, dim=0)  # (nh, S, hd)
    v = torch.stack(values, dim=1).repeat_interleave(group, dim=0)
    weights = torch.softmax((q[:, None, :] * k).sum(-1) / math.sqrt(attn.head_dim), dim=-1)
    out = (weights[..., None] * v).sum(1)  # (nh, hd)
    return attn.o_proj(out.reshape(-1))


def reference_loss(drafter, input_ids, loss_mask, aux, target_logits):
    layer = drafter.midlayer
    hidden = drafter.fuse(aux)[0]  # (T, H)
    ids = input_ids[0]
    draft_ids = drafter.draft_ids()
    probs = torch.softmax(target_logits[0].float(), -1)
    block_k, block_v = [], []  # per step: (nkv, T, hd) keys/values
    total = 0.0
    for j in range(STEPS):
        outs, step_k, step_v, queries = [], [], [], []
        for i in range(T):
            token = ids[i + 1 + j] if i + 1 + j < T else torch.tensor(0)
            embeds = drafter.embed_tokens(token)[None, None]
            h = hidden[i][None, None]
            cos, sin = drafter.rotary(h, torch.tensor([[i + j]]))
            attn_in = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(h)], -1)
            q, (k, v) = layer.self_attn.project_kv(attn_in, cos, sin)
            queries.append(q[0, :, 0])
            step_k.append(k[0, :, 0])
            step_v.append(v[0, :, 0])
        block_k.append(torch.stack(step_k, dim=1))
        block_v.append(torch.stack(step_v, dim=1))
        losses, count = 0.0, 0
        for i in range(T):
            keys = [block_k[0][:, s] for s in range(i + 1)] + [block_k[m][:, i] for m in range(1, j + 1)]
            values = [block_v[0][:, s] for s in range(i + 1)] + [block_v[m][:, i] for m in range(1, j + 1)]
            a = _attend_reference(layer.self_attn, queries[i], keys, values)
            h = hidden[i] + a
            outs.append(h + layer.mlp(layer.post_attention_layernorm(h)))
            if i + 2 + j < T and loss_mask[0, i + 2 + j] and drafter.t2d[probs[i + 1 + j].argmax()]:
                target = probs[i + 1 + j][draft_ids]
                target = target / target.sum()
                logp = torch.log_softmax(drafter.lm_head(drafter.norm(outs[i])).float(), -1)
                losses = losses - (target * logp).sum()
                count += 1
        total = total + 0.8 ** j * losses / max(count, 1)
        hidden = torch.stack(outs)
    return total


def test_ttt_loss_equals_the_step_by_step_reference():
    target = tiny_target("llama")
    target.lm_head.weight.data *= 10
    torch.manual_seed(0)
    drafter = Eagle3Drafter(target.config, Eagle3Config(draft_vocab_size=100, ttt_steps=STEPS))
    drafter.init_from_target(target)
    input_ids = torch.randint(2, 128, (1, T), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones(1, T, dtype=torch.long)
    loss_mask = torch.ones(1, T, dtype=torch.long)
    loss_mask[0, :3] = 0
    feats = target_features(target, input_ids, attention_mask, loss_mask, drafter.layer_ids)
    loss, _ = eagle3_loss(drafter, input_ids, attention_mask, loss_mask, feats.aux_hidden,
                          feats.logits_after)
    expected = reference_loss(drafter, input_ids, loss_mask, feats.aux_hidden, feats.target_logits)
    torch.testing.assert_close(loss, expected.float(), rtol=1e-4, atol=1e-5)
    # and gradients agree too
    grad = torch.autograd.grad(loss, drafter.fc.weight)[0]
    expected_grad = torch.autograd.grad(
        reference_loss(drafter, input_ids, loss_mask, feats.aux_hidden, feats.target_logits),
        drafter.fc.weight)[0]
    torch.testing.assert_close(grad, expected_grad, rtol=1e-3, atol=1e-6)


def test_ttt_masks_shape_and_pattern():
    masks = ttt_masks(torch.ones(1, 4, dtype=torch.long), 3)
    assert [tuple(m.shape) for m in masks] == [(1, 1, 4, 4), (1, 1, 4, 8), (1, 1, 4, 12)]
    m = masks[2][0, 0].int()
    assert m[:, :4].tolist() == torch.ones(4, 4).tril().int().tolist()
    assert m[:, 4:8].tolist() == torch.eye(4).int().tolist()
    assert m[:, 8:].tolist() == torch.eye(4).int().tolist()


def dense_ttt_loss(drafter, input_ids, attention_mask, loss_mask, aux_hidden, features):
    """EAGLE-3's loss with every TTT step run through SDPA with the dense `ttt_masks` on the whole
    padded (B, T) batch and the trained rows picked by boolean indexing: the reference of the
    mask-free attention and the mask-selected rows."""
    b, t = input_ids.shape
    positions = torch.arange(t)[None].expand(b, t)
    index = torch.arange(t)[None]
    draft_ids = drafter.draft_ids()
    masks = ttt_masks(attention_mask, drafter.config.ttt_steps)
    hidden, cache, total, metrics = drafter.fuse(aux_hidden), [], 0.0, {}
    for j in range(drafter.config.ttt_steps):
        out, kv = drafter.step(shift_left(input_ids, 1 + j), hidden, positions + j, masks[j],
                               extra_kv=cache, with_logits=False)
        cache = [*cache, kv]
        valid = (shift_left(loss_mask, 2 + j) > 0) & (index < t - 2 - j)
        rows = features.logits_after(valid, 1 + j).float()
        choice = rows.argmax(-1)
        in_vocab = drafter.t2d[choice]
        target_j = torch.softmax(rows[in_vocab][:, draft_ids], dim=-1)
        trained = valid.sum().clamp_min(1)
        valid[valid.clone()] = in_vocab
        logp = torch.log_softmax(drafter.lm_head(drafter.norm(out[valid])).float(), dim=-1)
        step_loss = -(target_j * logp).sum() / valid.sum().clamp_min(1)
        total = total + drafter.config.step_weight ** j * step_loss
        metrics[f"loss_{j}"] = step_loss.detach()
        metrics[f"acc_{j}"] = (draft_ids[logp.argmax(-1)] == choice[in_vocab]).sum() / trained
        hidden = out
    return total, metrics


def _padded_batch(t=24):
    """Three rows of different lengths (right padding) with prompts of different lengths."""
    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(2, 128, (3, t), generator=gen)
    attention_mask = torch.ones(3, t, dtype=torch.long)
    attention_mask[1, 15:] = 0
    attention_mask[2, 9:] = 0
    loss_mask = attention_mask.clone()
    loss_mask[0, :5] = 0
    loss_mask[1, :12] = 0
    loss_mask[2, :2] = 0
    loss_mask[0, 10:13] = 0  # a second user turn inside the first row
    return input_ids * attention_mask, attention_mask, loss_mask


@pytest.mark.parametrize("steps", [1, 3, 5])
def test_ttt_loss_equals_the_dense_mask_and_boolean_rows_path(steps):
    target = tiny_target("qwen2")
    target.lm_head.weight.data *= 10
    torch.manual_seed(0)
    drafter = Eagle3Drafter(target.config, Eagle3Config(draft_vocab_size=100, ttt_steps=steps))
    drafter.init_from_target(target)
    for param in drafter.parameters():  # away from the zero-ish start, so every term matters
        if param.requires_grad and param.dim() == 2:
            param.data *= 3
    input_ids, attention_mask, loss_mask = _padded_batch()
    feats = target_features(target, input_ids, attention_mask, loss_mask, drafter.layer_ids)
    params = [p for p in drafter.parameters() if p.requires_grad]
    loss, metrics = eagle3_loss(drafter, input_ids, attention_mask, loss_mask, feats.aux_hidden,
                                feats)
    grads = torch.autograd.grad(loss, params)
    expected, expected_metrics = dense_ttt_loss(drafter, input_ids, attention_mask, loss_mask,
                                                feats.aux_hidden, feats)
    expected_grads = torch.autograd.grad(expected, params)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert metrics.keys() == expected_metrics.keys()
    for key, value in metrics.items():
        torch.testing.assert_close(value.float(), expected_metrics[key].float(), rtol=1e-5,
                                   atol=1e-6)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-6)
    assert float(loss.detach()) > 0 and any(float(g.abs().sum()) > 0 for g in grads)


def test_ttt_rows_skip_padding_and_rows_no_later_step_trains():
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 0]])
    index = torch.arange(8)[None]
    valid = [(shift_left(loss_mask, 2 + j) > 0) & (index < 8 - 2 - j) for j in range(3)]
    needed = ttt_rows(attention_mask, valid)
    assert needed[0][0].tolist() == [True] * 6 + [False] * 2  # every real token: block 0's keys
    assert needed[1][0].nonzero().flatten().tolist() == [0, 1, 2]  # trained at step 1 or 2
    assert needed[2][0].nonzero().flatten().tolist() == [0, 1]


def test_the_cached_argmax_gives_the_same_loss_without_the_full_head():
    """With the cache's `target_argmax` the teacher applies only the draft-vocabulary rows of the
    head; the loss, metrics and gradients are those of the full-head path."""
    from dataclasses import replace

    target = tiny_target("llama")
    target.lm_head.weight.data *= 10
    torch.manual_seed(0)
    drafter = Eagle3Drafter(target.config, Eagle3Config(draft_vocab_size=100, ttt_steps=3))
    drafter.init_from_target(target)
    input_ids, attention_mask, loss_mask = _padded_batch()
    feats = target_features(target, input_ids, attention_mask, loss_mask, drafter.layer_ids)
    cached = replace(feats, target_argmax=feats.target_logits.argmax(-1))
    calls = []
    handle = target.lm_head.register_forward_hook(lambda *a: calls.append(1))
    try:
        loss, metrics = eagle3_loss(drafter, input_ids, attention_mask, loss_mask,
                                    cached.aux_hidden, cached)
    finally:
        handle.remove()
    assert not calls, "the full-vocabulary head ran although the argmax was cached"
    expected, expected_metrics = eagle3_loss(drafter, input_ids, attention_mask, loss_mask,
                                             feats.aux_hidden, feats)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for key, value in metrics.items():
        torch.testing.assert_close(value, expected_metrics[key], rtol=1e-5, atol=1e-6)
