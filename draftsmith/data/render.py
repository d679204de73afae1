"""Render conversations with the target's chat template into `input_ids` and an assistant-only loss mask.

The mask is 1 exactly on the tokens the target itself produces in an assistant turn: the
content and the end-of-turn token that stops generation (`<|im_end|>`, `<|eot_id|>`), and 0 on
system and user turns and on the template's own tokens (role headers, the newline after
`<|im_end|>`). Spans are found without knowing the template: for the assistant message at
position i, the text of `messages[:i]` with the generation prompt and the text of `messages[:i+1]`
are both prefixes of the whole conversation's text, and the assistant turn is what lies between.
Inside that span the mask stops after the first special token that follows the content (or
covers the whole span when the template uses no special token); for an answer marked `cut`
(stopped at the regeneration cap) it stops at the content's last token. A token belongs to a span when
its first character does (tokenizer offsets), so a fast tokenizer is required.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.data.conversations import Conversation
from draftsmith.errors import DraftsmithError


@dataclass(frozen=True)
class RenderedSample:
    """One conversation as tokens. `loss_mask[t]` is 1 where token t is trained on. (T,), (T,)"""

    input_ids: list[int]
    loss_mask: list[int]
    conversation_id: str = ""


@dataclass
class RenderStats:
    """Totals over rendered conversations."""

    rendered: int = 0
    truncated: int = 0
    tokens: int = 0
    masked_tokens: int = 0
    dropped: Counter = field(default_factory=Counter)

    def to_json(self) -> dict:
        return {"rendered": self.rendered, "truncated": self.truncated, "tokens": self.tokens,
                "masked_tokens": self.masked_tokens, "dropped": dict(self.dropped)}

    def summary(self) -> str:
        line = (f"{self.rendered:,} conversations rendered, {self.tokens:,} tokens, "
                f"{self.masked_tokens:,} trained on ({self.truncated:,} truncated to max_length)")
        if self.dropped:
            line += "; dropped: " + ", ".join(f"{n:,} {r}" for r, n in self.dropped.items())
        return line


def resolve_chat_template(tokenizer, chat_template: str | None = None) -> str:
    """The Jinja chat template to use: `chat_template` (a template or a path to one), else the
    tokenizer's.

    Raises:
        DraftsmithError: neither is available, or the given path does not exist.
    """
    if chat_template:
        if "{" not in chat_template:
            path = Path(chat_template).expanduser()
            if not path.is_file():
                raise DraftsmithError(
                    f"chat_template {chat_template!r} is neither a Jinja template nor an existing "
                    "file; pass the template text or the path of a .jinja file"
                )
            return path.read_text()
        return chat_template
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise DraftsmithError(
            f"the tokenizer of {name!r} has no chat template, so conversations cannot be "
            "rendered; set `chat_template` in the data recipe (or --chat-template) to a Jinja "
            "template or a .jinja file, or use an instruct/chat model"
        )
    return template


def render_text(tokenizer, messages: Sequence[dict], template: str, generation_prompt: bool) -> str:
    """The chat template applied to `messages`, as text."""
    return tokenizer.apply_chat_template(
        [{k: v for k, v in m.items() if k != "cut"} for m in messages], chat_template=template,
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )


def prompt_ids(tokenizer, messages: Sequence[dict], template: str) -> list[int]:
    """Token ids of `messages` followed by the generation prompt (what the target answers)."""
    text = render_text(tokenizer, messages, template, generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def end_of_turn_ids(tokenizer) -> set[int]:
    """Ids of the special tokens (EOS, `<|im_end|>`, `<|eot_id|>` ...) that can end a turn."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special)
    return ids


def assistant_spans(
    tokenizer, messages: Sequence[dict], template: str
) -> tuple[str, list[tuple[int, int, int]]]:
    """The conversation's text and, per assistant message, `(start, content_end, end)` offsets.

    Raises:
        DraftsmithError: the template renders a shorter conversation as something other than a
            prefix of the longer one (it rewrites earlier turns), so spans cannot be located.
    """
    text = render_text(tokenizer, messages, template, generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render_text(tokenizer, messages[:i], template, generation_prompt=True)
        through = render_text(tokenizer, messages[: i + 1], template, generation_prompt=False)
        if not (through.startswith(before) and text.startswith(through)):
            raise DraftsmithError(
                f"the chat template renders message {i} differently depending on what follows it "
                "(it is not prefix-stable, e.g. it drops earlier reasoning or dates), so the "
                "assistant-only loss mask cannot be located; set `chat_template` to a template "
                "that renders each turn the same way in every conversation"
            )
        found = text.find(message["content"], len(before), len(through))
        content_end = found + len(message["content"]) if found >= 0 else len(before)
        spans.append((len(before), content_end, len(through)))
    return text, spans


def render_messages(
    tokenizer, messages: Sequence[dict], template: str, max_length: int | None = None
) -> tuple[list[int], list[int]]:
    """`(input_ids, loss_mask)` of a conversation, truncated to `max_length` tokens.

    Raises:
        DraftsmithError: a slow tokenizer (no character offsets), or see `assistant_spans`.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise DraftsmithError(
            "rendering loss masks needs a fast tokenizer (with character offsets); load the "
            "tokenizer with use_fast=True or convert it with `tokenizers`"
        )
    text, spans = assistant_spans(tokenizer, messages, template)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids = list(encoded.input_ids)
    starts = [start for start, _ in encoded.offset_mapping]
    stop_ids = end_of_turn_ids(tokenizer)
    loss_mask = [0] * len(input_ids)
    token = 0
    cut = [bool(m.get("cut")) for m in messages if m["role"] == "assistant"]
    for (start, content_end, end), was_cut in zip(spans, cut, strict=True):
        while token < len(input_ids) and starts[token] < start:
            token += 1
        inside = []
        while token < len(input_ids) and starts[token] < end:
            inside.append(token)
            token += 1
        if was_cut:  # an answer stopped at the cap: the end-of-turn after it was never generated
            stop = sum(starts[t] < content_end for t in inside) - 1
        else:
            stop = next((k for k, t in enumerate(inside)
                         if starts[t] >= content_end and input_ids[t] in stop_ids),
                        len(inside) - 1)
        for t in inside[: stop + 1]:
            loss_mask[t] = 1
    if max_length is not None:
        input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
    return input_ids, loss_mask


def render_conversations(
    tokenizer,
    conversations: Iterable[Conversation],
    template: str,
    max_length: int,
    stats: RenderStats | None = None,
) -> list[RenderedSample]:
    """Render every conversation; those with no trained token within `max_length` are dropped
    and counted in `stats`."""
    stats = stats if stats is not None else RenderStats()
    samples = []
    for conversation in conversations:
        input_ids, loss_mask = render_messages(tokenizer, conversation.messages, template)
        if len(input_ids) > max_length:
            stats.truncated += 1
            input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
        if not any(loss_mask):
            stats.dropped["no assistant token within max_length"] += 1
            continue
        stats.rendered += 1
        stats.tokens += len(input_ids)
        stats.masked_tokens += sum(loss_mask)
        samples.append(RenderedSample(input_ids, loss_mask, conversation.id))
    return samples
