"""Hugging Face `generate` baselines, run on the same prompts: plain, assisted, prompt lookup."""

from __future__ import annotations

import time

import torch

from draftsmith.decoding.sampling import SamplingConfig

HF_METHODS = ("hf_generate", "hf_assisted", "hf_prompt_lookup")


@torch.inference_mode()
def hf_generate(method: str, model, prompt_ids: list[int], max_new_tokens: int,
                eos_token_ids: list[int], sampling: SamplingConfig,
                draft_model=None, prompt_lookup_tokens: int = 10) -> tuple[list[int], float]:
    """Run one HF baseline; returns (new tokens, seconds)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                  eos_token_id=list(eos_token_ids), pad_token_id=eos_token_ids[0])
    if sampling.greedy:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=0)
        torch.manual_seed(sampling.seed)
    if method == "hf_assisted":
        kwargs["assistant_model"] = draft_model
    elif method == "hf_prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_tokens
    elif method != "hf_generate":
        raise ValueError(f"unknown HF baseline {method!r}; choose from {HF_METHODS}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - start
