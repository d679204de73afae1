"""EAGLE-3.1 (`fc_norm`, `norm_output`) against hand-written formulas: the fused input is fc of
the three RMS-normed layer outputs; the final norm's output feeds the head once and the next TTT
step; the TTT loss equals a step-by-step reference, gradients included; and a two-step decode
chain (`draft` with a KV cache) gives the same second-step logits as TTT step 1."""

from __future__ import annotations

import torch

from draftsmith.models.eagle3 import Eagle3Config, Eagle3Drafter, eagle3_loss
from draftsmith.models.features import target_features
from draftsmith.models.layers import causal_mask, shift_left
from draftsmith.models.ttt_rows import ttt_masks
from tests.helpers.tiny_targets import tiny_target

STEPS, T = 3, 10


def _rms(x, weight, eps):
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _drafter(target, **settings):
    torch.manual_seed(0)
    config = Eagle3Config(draft_vocab_size=100, ttt_steps=STEPS, fc_norm=True, norm_output=True,
                          **settings)
    drafter = Eagle3Drafter(target.config, config)
    drafter.init_from_target(target)
    gen = torch.Generator().manual_seed(7)
    for norm in [*drafter.fc_norm, drafter.norm]:  # not all ones: each norm must be the right one
        norm.weight.data = torch.rand(norm.weight.shape, generator=gen) + 0.5
    return drafter


def _inputs(target):
    input_ids = torch.randint(2, 128, (1, T), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, T, dtype=torch.long)
    loss_mask = mask.clone()
    loss_mask[0, :3] = 0
    return input_ids, mask, loss_mask


def test_fc_norm_and_norm_output_by_hand():
    target = tiny_target("llama")
    drafter = _drafter(target)
    eps = drafter.layer_config.rms_norm_eps
    aux = [torch.randn(1, T, 32, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    fused = drafter.fc(torch.cat([_rms(h, n.weight, eps) for h, n in zip(aux, drafter.fc_norm,
                                                                          strict=True)], -1))
    torch.testing.assert_close(drafter.fuse(aux), fused)
    tokens = torch.randint(2, 128, (1, T), generator=torch.Generator().manual_seed(2))
    positions = torch.arange(T)[None]
    state, logits, _ = drafter.step(tokens, fused, positions, causal_mask(T, tokens.device))
    embeds = drafter.embed_tokens(tokens)
    cos, sin = drafter.rotary(fused, positions)
    raw, _ = drafter.midlayer.run(embeds, fused, cos, sin, causal_mask(T, tokens.device))
    torch.testing.assert_close(state, _rms(raw, drafter.norm.weight, eps))  # fed back normed
    torch.testing.assert_close(logits, drafter.lm_head(state))  # and no second norm


def reference_loss(drafter, input_ids, loss_mask, aux, target_logits):
    """Every TTT step on the whole sequence with `step` (masks: block 0 causal, then the own
    position in each later block), the state fed back as `step` returns it (normed), the head
    applied without a second norm, soft cross-entropy on the draft vocabulary."""
    eps = drafter.layer_config.rms_norm_eps
    hidden = drafter.fc(torch.cat([_rms(h, n.weight, eps) for h, n in zip(aux, drafter.fc_norm,
                                                                          strict=True)], -1))
    masks = ttt_masks(torch.ones_like(input_ids), STEPS)
    probs = torch.softmax(target_logits[0].float(), -1)
    draft_ids = drafter.draft_ids()
    cache, total = [], 0.0
    for j in range(STEPS):
        state, _, kv = drafter.step(shift_left(input_ids, 1 + j), hidden,
                                    torch.arange(T)[None] + j, masks[j], extra_kv=cache)
        cache.append(kv)
        losses, count = 0.0, 0
        for i in range(T - 2 - j):
            if loss_mask[0, i + 2 + j] and drafter.t2d[probs[i + 1 + j].argmax()]:
                p = probs[i + 1 + j][draft_ids]
                logp = torch.log_softmax(drafter.lm_head(state[0, i]).float(), -1)
                losses = losses - (p / p.sum() * logp).sum()
                count += 1
        total = total + 0.8 ** j * losses / max(count, 1)
        hidden = state
    return total


def test_eagle31_ttt_loss_and_gradients_equal_the_step_by_step_reference():
    target = tiny_target("llama")
    target.lm_head.weight.data *= 10
    drafter = _drafter(target)
    input_ids, mask, loss_mask = _inputs(target)
    feats = target_features(target, input_ids, mask, loss_mask, drafter.layer_ids)
    loss, _ = eagle3_loss(drafter, input_ids, mask, loss_mask, feats.aux_hidden,
                          feats.logits_after)
    expected = reference_loss(drafter, input_ids, loss_mask, feats.aux_hidden, feats.target_logits)
    torch.testing.assert_close(loss, expected.float(), rtol=1e-4, atol=1e-5)
    for param in (drafter.fc_norm[1].weight, drafter.norm.weight, drafter.fc.weight):
        ours = torch.autograd.grad(loss, param, retain_graph=True)[0]
        theirs = torch.autograd.grad(expected, param, retain_graph=True)[0]
        assert ours.abs().sum() > 0
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-6)


@torch.no_grad()
def test_a_decode_chain_feeds_back_the_state_as_ttt_does():
    target = tiny_target("llama")
    drafter = _drafter(target).eval()
    input_ids, mask, _ = _inputs(target)
    feats = target_features(target, input_ids, mask, mask, drafter.layer_ids)
    hidden = drafter.fuse(feats.aux_hidden)
    masks = ttt_masks(mask, 2)
    positions = torch.arange(T)[None]
    state0, _, kv0 = drafter.step(shift_left(input_ids, 1), hidden, positions, masks[0])
    _, logits1, _ = drafter.step(shift_left(input_ids, 2), state0, positions + 1, masks[1],
                                 extra_kv=[kv0])
    draft_ids = drafter.draft_ids()
    for i in range(T - 2):
        # decode: the first draft step over positions 0..i, then one more step from its state
        rows = torch.arange(i + 1)
        state, _, kv = drafter.draft(input_ids[0, rows + 1], hidden[0, rows], rows,
                                     causal_mask(i + 1, input_ids.device))
        _, logp, _ = drafter.draft(input_ids[0, i + 2][None], state[-1:], torch.tensor([i + 1]),
                                   torch.ones(1, 1, 1, i + 2, dtype=torch.bool), past=kv)
        torch.testing.assert_close(logp[0, draft_ids], torch.log_softmax(logits1[0, i], -1),
                                   rtol=1e-4, atol=1e-5)
