"""The tiny random targets are real transformers models of each family with working KV caches."""

import torch

from tests.helpers.tiny_targets import tiny_target


def test_tiny_target_is_frozen_family_model(tiny_model):
    assert tiny_model.config.model_type in ("llama", "qwen2")
    assert tiny_model.config.hidden_size == 32
    assert not tiny_model.training
    assert all(not p.requires_grad for p in tiny_model.parameters())


def test_tiny_target_is_deterministic_per_seed():
    a, b, c = tiny_target("llama", seed=3), tiny_target("llama", seed=3), tiny_target("llama", seed=4)
    ids = torch.tensor([[5, 9, 17, 33]])
    assert torch.equal(a(ids).logits, b(ids).logits)
    assert not torch.equal(a(ids).logits, c(ids).logits)


def test_tiny_target_incremental_decoding_matches_full_forward(tiny_model):
    ids = torch.randint(2, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    full = tiny_model(ids).logits
    first = tiny_model(ids[:, :8], use_cache=True)
    step = tiny_model(ids[:, 8:], past_key_values=first.past_key_values, use_cache=True)
    torch.testing.assert_close(step.logits, full[:, 8:], rtol=1e-5, atol=1e-5)


def test_tiny_target_hidden_states_end_after_final_norm(tiny_model):
    ids = torch.tensor([[3, 4, 5]])
    out = tiny_model(ids, output_hidden_states=True)
    assert len(out.hidden_states) == tiny_model.config.num_hidden_layers + 1
    torch.testing.assert_close(tiny_model.lm_head(out.hidden_states[-1]), out.logits)
