"""Tokenizers for the data tests: a 128-token character tokenizer that fits the tiny random
targets, chat templates of the three families the loss mask must handle, and the real SmolLM2
tokenizer with any of them swapped in."""

from __future__ import annotations

import copy

from tokenizers import AddedToken, Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

# ChatML as SmolLM2 ships it (a default system prompt when none is given).
CHATML_SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen2.5's template without tools: its own default system prompt, then ChatML turns.
CHATML_QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if (message.role == 'user') or (message.role == 'system' "
    "and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
# Llama-3 (header tokens, trimmed content, <|eot_id|> ends each turn, no newline after it).
LLAMA3 = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{%- endif %}"
)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# id 0 pads and begins, id 1 ends a turn: the tiny targets' bos/pad = 0 and eos = 1.
CHAR_SPECIALS = ["<|endoftext|>", "<|im_end|>", "<|im_start|>"]


def char_tokenizer(template: str = CHATML_SMOLLM2) -> PreTrainedTokenizerFast:
    """One token per character (printable ASCII and newline), 128 ids, ChatML special tokens."""
    chars = ["\n", *(chr(c) for c in range(32, 127))]
    filler = [chr(0xC0 + k) for k in range(128 - len(CHAR_SPECIALS) - len(chars))]
    vocab = {token: i for i, token in enumerate(CHAR_SPECIALS + chars + filler)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|endoftext|>"))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in CHAR_SPECIALS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    tokenizer.chat_template = template
    return tokenizer


def with_template(tokenizer, template: str, specials: list[str] | None = None):
    """A copy of `tokenizer` with `template` and extra special tokens (the first is BOS)."""
    tokenizer = copy.deepcopy(tokenizer)
    if specials:
        tokenizer.add_special_tokens({"additional_special_tokens": specials})
        tokenizer.bos_token = specials[0]
    tokenizer.chat_template = template
    return tokenizer
