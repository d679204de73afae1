"""EAGLE-3's training-time test against a plain step-by-step reference: position by position,
step j attends to step 0's keys up to its own position and to its own position in steps 1..j."""

from __future__ import annotations

import math

import torch

from draftsmith.models.eagle3 import Eagle3Config, Eagle3Drafter, eagle3_loss, ttt_masks
from draftsmith.registry import target_features
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
