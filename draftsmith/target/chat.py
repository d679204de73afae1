"""Plain (non-speculative) chat generation with a loaded target: the smoke test of a target."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.target.load import Target


@dataclass
class Reply:
    """A generated reply and how fast it came."""

    text: str
    new_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")


def render_chat(tokenizer, messages: list[dict], template: str | None = None) -> list[int]:
    """Token ids of `messages` in a chat template, ready for the assistant's turn.

    Args:
        tokenizer: the target's tokenizer.
        messages: the conversation so far.
        template: a Jinja chat template (e.g. the one a drafter was trained with); None = the
            tokenizer's own.

    Raises:
        DraftsmithError: no template given and the tokenizer has none.
    """
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise DraftsmithError(
            "the target's tokenizer has no chat template; use an instruct/chat model"
        )
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                         chat_template=template)
    return tokenizer(text, add_special_tokens=False).input_ids


def chat_input_ids(tokenizer, prompt: str, system: str | None = None) -> torch.Tensor:
    """One user turn (after an optional system prompt) rendered for generation. (1, T)"""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    return torch.tensor([render_chat(tokenizer, messages)])


@torch.inference_mode()
def generate_reply(target: Target, prompt: str, max_new_tokens: int = 64) -> Reply:
    """Greedy plain decoding of one chat turn with Hugging Face `generate`."""
    device = next(target.model.parameters()).device
    input_ids = chat_input_ids(target.tokenizer, prompt).to(device)
    start = time.perf_counter()
    output = target.model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=target.eos_token_ids,
        pad_token_id=target.eos_token_ids[0],
    )
    seconds = time.perf_counter() - start
    new = output[0, input_ids.shape[1]:]
    text = target.tokenizer.decode(new, skip_special_tokens=True)
    return Reply(text=text, new_tokens=int(new.numel()), seconds=seconds)
