"""The mask-free training-time-test attention against the dense masked SDPA it replaced (the
reference is `ttt_masks` + SDPA with `enable_gqa`, the old code path): outputs and gradients of
every input, with GQA and right padding; and gradient checkpointing of the drafter's layer leaves
EAGLE-3's loss and gradients unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.models.eagle3 import Eagle3Config, Eagle3Drafter, eagle3_loss
from draftsmith.models.features import target_features
from draftsmith.models.layers import set_gradient_checkpointing
from draftsmith.models.ttt_attention import ttt_attention
from draftsmith.models.ttt_rows import ttt_masks
from tests.helpers.tiny_targets import tiny_target


def _dense_reference(q, blocks, attention_mask):
    """Step j = len(blocks) - 1 as one SDPA over [block 0, ..., block j] with the dense mask."""
    mask = ttt_masks(attention_mask, len(blocks))[-1]
    return F.scaled_dot_product_attention(q, torch.cat([k for k, _ in blocks], dim=2),
                                          torch.cat([v for _, v in blocks], dim=2),
                                          attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize("heads", [(4, 2), (4, 4)])
@pytest.mark.parametrize("step", [0, 1, 2, 4])
def test_ttt_attention_equals_the_dense_masked_sdpa(step, heads):
    nh, nkv = heads
    b, t, hd = 3, 11, 8
    gen = torch.Generator().manual_seed(step)
    attention_mask = torch.ones(b, t, dtype=torch.long)
    attention_mask[1, 7:] = 0
    attention_mask[2, 3:] = 0
    q = torch.randn(b, nh, t, hd, generator=gen, dtype=torch.float64, requires_grad=True)
    blocks = [tuple(torch.randn(b, nkv, t, hd, generator=gen, dtype=torch.float64,
                                requires_grad=True) for _ in range(2)) for _ in range(step + 1)]
    inputs = [q, *(x for kv in blocks for x in kv)]
    real = attention_mask.bool()[:, None, :, None]  # padding queries' outputs are never read
    weight = torch.randn(b, nh, t, hd, generator=gen, dtype=torch.float64) * real

    out = ttt_attention(q, blocks[0], blocks[1:])
    expected = _dense_reference(q, blocks, attention_mask)
    torch.testing.assert_close(out * real, expected * real, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad((out * weight).sum(), inputs)
    expected_grads = torch.autograd.grad((expected * weight).sum(), inputs)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)


def test_ttt_attention_in_bfloat16_stays_close_to_the_float64_result():
    """The sink score rides in bf16 as a high and a low part: bf16 inputs give bf16-sized
    errors (the same as the dense path's), not a shifted softmax."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=gen)
    blocks = [(torch.randn(2, 2, 16, 8, generator=gen), torch.randn(2, 2, 16, 8, generator=gen))
              for _ in range(4)]
    exact = ttt_attention(q.double(), *_split([(k.double(), v.double()) for k, v in blocks]))
    low = ttt_attention(q.bfloat16(), *_split([(k.bfloat16(), v.bfloat16()) for k, v in blocks]))
    dense = _dense_reference(q.bfloat16(), [(k.bfloat16(), v.bfloat16()) for k, v in blocks],
                             torch.ones(2, 16, dtype=torch.long))
    error, dense_error = (float((x.double() - exact).abs().max()) for x in (low, dense))
    assert error < 0.03 and error <= 2 * dense_error + 1e-3


def _split(blocks):
    return blocks[0], blocks[1:]


def test_gradient_checkpointing_leaves_eagle3_loss_and_gradients_unchanged():
    target = tiny_target("llama")
    torch.manual_seed(0)
    drafter = Eagle3Drafter(target.config, Eagle3Config(draft_vocab_size=100, ttt_steps=3))
    drafter.init_from_target(target)
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(2, 128, (2, 16), generator=gen)
    attention_mask = torch.ones(2, 16, dtype=torch.long)
    attention_mask[1, 11:] = 0
    loss_mask = attention_mask.clone()
    loss_mask[:, :4] = 0
    feats = target_features(target, input_ids, attention_mask, loss_mask, drafter.layer_ids)
    params = [p for p in drafter.parameters() if p.requires_grad]

    def loss_and_grads():
        loss, _ = eagle3_loss(drafter, input_ids, attention_mask, loss_mask, feats.aux_hidden,
                              feats)
        return loss.detach(), torch.autograd.grad(loss, params)

    plain_loss, plain_grads = loss_and_grads()
    assert set_gradient_checkpointing(drafter, True) == 1
    assert drafter.midlayer.gradient_checkpointing
    loss, grads = loss_and_grads()
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
    for grad, plain in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(grad, plain, rtol=1e-6, atol=1e-7)
    assert any(float(g.abs().sum()) > 0 for g in grads)


def _sink_split_after_the_division(q, block0, diagonal):
    """`ttt_attention` as it was: the sink score split into bf16 parts, then each divided by the
    scale in bf16 (a rounding the division adds where the scale is not a power of two)."""
    import math

    from draftsmith.models.ttt_attention import _PAD
    k0, v0 = block0
    b, nh, t, hd = q.shape
    group, scale = nh // k0.shape[1], 1.0 / math.sqrt(hd)
    dk = torch.stack([k.repeat_interleave(group, 1) for k, _ in diagonal], dim=-2)
    dv = torch.stack([v.repeat_interleave(group, 1) for _, v in diagonal], dim=-2)
    scores = torch.matmul(q.unsqueeze(-2), dk.transpose(-1, -2)).squeeze(-2).float() * scale
    sink = torch.logsumexp(scores, dim=-1)
    high = sink.to(q.dtype)
    low = (sink - high.float()).to(q.dtype)
    extra_q = q.new_zeros(b, nh, t, _PAD)
    extra_q[..., 0], extra_q[..., 1] = high / scale, low / scale
    k_aug = F.pad(k0.repeat_interleave(group, 1), (0, _PAD, 1, 0))
    k_aug[:, :, 0, hd:hd + 2] = 1.0
    v_aug = F.pad(v0.repeat_interleave(group, 1), (0, _PAD, 1, 0))
    v_aug[:, :, 0, hd] = 1.0
    out = F.scaled_dot_product_attention(F.pad(torch.cat([q, extra_q], -1), (0, 0, 1, 0)),
                                         k_aug, v_aug, is_causal=True, scale=scale)[:, :, 1:]
    weights = torch.softmax(scores, dim=-1).to(q.dtype).unsqueeze(-2)
    diagonal_part = out[..., hd:hd + 1].float() * torch.matmul(weights, dv).squeeze(-2).float()
    return (out[..., :hd].float() + diagonal_part).to(q.dtype)


def test_the_sink_divided_in_float32_before_the_split_shrinks_the_bf16_error_at_head_dim_128():
    """At head_dim 128 (scale 1/sqrt(128), not a power of two) dividing the sink's bf16 parts by
    the scale rounds them again; dividing in float32 first leaves only the split's rounding. Both
    against float64 on the same bf16 inputs."""
    gen = torch.Generator().manual_seed(0)

    def rounded(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen) * s).bfloat16()

    q = rounded(2, 4, 64, 128, s=2.0)
    blocks = [(rounded(2, 2, 64, 128, s=2.0), rounded(2, 2, 64, 128)) for _ in range(4)]
    exact = ttt_attention(q.double(), *_split([(k.double(), v.double()) for k, v in blocks]))

    def error(attention):
        out = attention(q, *_split(blocks)).double()
        return float(((out - exact).abs() / exact.abs().clamp_min(1e-2)).mean())

    now, before = error(ttt_attention), error(_sink_split_after_the_division)
    assert now < 0.9 * before, (now, before)
