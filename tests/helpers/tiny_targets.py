"""Tiny random Llama and Qwen2 targets built in memory: the test bed for every drafter and loop."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

TINY = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=1,
    bos_token_id=0,
    pad_token_id=0,
)

FAMILIES = ("llama", "qwen2")


def tiny_config(family: str, **overrides):
    """Config of a tiny target of `family` (`llama` or `qwen2`), with overrides."""
    kwargs = dict(TINY, **overrides)
    if family == "llama":
        return LlamaConfig(**kwargs)
    if family == "qwen2":
        return Qwen2Config(**kwargs)
    raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")


def tiny_target(family: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """A frozen tiny random causal LM in eval mode, deterministic for a given seed."""
    torch.manual_seed(seed)
    cls = LlamaForCausalLM if family == "llama" else Qwen2ForCausalLM
    model = cls(tiny_config(family, **overrides)).to(dtype)
    return model.eval().requires_grad_(False)


def save_target_and_draft(root):
    """A tiny Llama target in `root/target` and a tiny draft model (another seed, same shapes and
    tokenizer) in `root/draft`, each with the character tokenizer; returns the target."""
    from tests.helpers.tiny_tokenizers import char_tokenizer

    target = tiny_target("llama")
    for folder, model in ((root / "target", target), (root / "draft", tiny_target("llama", 1))):
        model.save_pretrained(folder)
        char_tokenizer().save_pretrained(folder)
    return target
