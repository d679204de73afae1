"""One normalized conversation shape for every source, and the rules that clean raw records into it.

A `Conversation` is an optional system message followed by user/assistant pairs, starting with a
user turn and ending with an assistant turn; multi-turn conversations stay whole. Raw records come
in two formats, recognised per record:

  * ShareGPT: `{"id": ..., "conversations": [{"from": "human" | "gpt" | "system", "value": ...}]}`
  * OpenAI:   `{"id": ..., "messages": [{"role": "user" | "assistant" | "system", "content": ...}]}`

An assistant message may carry `"cut": true` (regeneration writes it for an answer stopped at
`max_new_tokens`); the flag is kept, and rendering then trains no end-of-turn token after it.

Cleaning drops what cannot be trained on and counts every drop by reason in `CleaningStats`:
empty turns, broken turns (missing or non-text content, unknown role), then every turn that is not
part of a user turn directly answered by an assistant turn: unanswered user turns (a trailing
question, or one whose answer was empty), assistant turns without a question (ShareGPT splits long
chats, so a piece can open with an answer to a question it does not hold), system turns after the
first; finally conversations with no user/assistant pair left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
}

UNPAIRED = {
    "user": "unanswered user turn",
    "assistant": "assistant turn without a user turn",
    "system": "system turn after the first",
}


@dataclass(frozen=True)
class Conversation:
    """A cleaned conversation.

    Attributes:
        id: the record's id (or `<source>:<position>` when it has none).
        messages: `{"role", "content"}` dicts; roles alternate user/assistant after an optional
            system message, the first non-system turn is a user turn and the last an assistant turn.
    """

    id: str
    messages: tuple[dict, ...]

    @property
    def system(self) -> str | None:
        """The system prompt, if any."""
        first = self.messages[0]
        return first["content"] if first["role"] == "system" else None

    @property
    def user_turns(self) -> list[str]:
        """The user messages in order (what regeneration answers)."""
        return [m["content"] for m in self.messages if m["role"] == "user"]

    @property
    def num_pairs(self) -> int:
        """Number of user/assistant exchanges."""
        return sum(m["role"] == "assistant" for m in self.messages)

    def to_json(self) -> dict:
        return {"id": self.id, "messages": [dict(m) for m in self.messages]}


@dataclass
class CleaningStats:
    """What cleaning kept and dropped, by reason."""

    records: int = 0
    kept: int = 0
    dropped_conversations: Counter = field(default_factory=Counter)
    dropped_turns: Counter = field(default_factory=Counter)

    def merge(self, other: CleaningStats) -> None:
        self.records += other.records
        self.kept += other.kept
        self.dropped_conversations.update(other.dropped_conversations)
        self.dropped_turns.update(other.dropped_turns)

    def to_json(self) -> dict:
        return {
            "records": self.records,
            "kept": self.kept,
            "dropped_conversations": dict(sorted(self.dropped_conversations.items())),
            "dropped_turns": dict(sorted(self.dropped_turns.items())),
        }

    def summary(self) -> str:
        """One line for the console."""
        dropped = sum(self.dropped_conversations.values())
        parts = [f"{self.kept:,} of {self.records:,} conversations kept"]
        if dropped:
            reasons = ", ".join(f"{n:,} {r}" for r, n in self.dropped_conversations.most_common())
            parts.append(f"dropped {dropped:,} ({reasons})")
        if self.dropped_turns:
            reasons = ", ".join(f"{n:,} {r}" for r, n in self.dropped_turns.most_common())
            parts.append(f"turns dropped: {reasons}")
        return "; ".join(parts)


def content_text(content) -> str | None:
    """Message content as text: a string, or OpenAI's list of `{"type": "text", "text"}` parts
    (joined); None for anything else (a part of another type: an image, audio)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    return None


def raw_turns(record: dict) -> list[tuple[str | None, str | None, bool]] | None:
    """`(role, text, cut)` triples of a ShareGPT or OpenAI record; None for an unknown format.

    Unknown roles and non-text content come back as None so that cleaning can count them.
    """
    if isinstance(record.get("conversations"), list):
        turns = []
        for turn in record["conversations"]:
            if not isinstance(turn, dict):
                turns.append((None, None, False))
                continue
            role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
            turns.append((role, content_text(turn.get("value")), False))
        return turns
    if isinstance(record.get("messages"), list):
        turns = []
        for message in record["messages"]:
            if not isinstance(message, dict):
                turns.append((None, None, False))
                continue
            role = message.get("role") if message.get("role") in ROLES else None
            turns.append((role, content_text(message.get("content")), message.get("cut") is True))
        return turns
    return None


def clean_record(record: dict, fallback_id: str, stats: CleaningStats) -> Conversation | None:
    """Clean one raw record into a `Conversation`, or None (the reason is counted in `stats`)."""
    stats.records += 1
    if not isinstance(record, dict) or (turns := raw_turns(record)) is None:
        stats.dropped_conversations["unknown format"] += 1
        return None
    messages: list[dict] = []
    for role, text, cut in turns:
        if role is None or text is None:
            stats.dropped_turns["broken"] += 1
        elif not text.strip():
            stats.dropped_turns["empty"] += 1
        else:
            messages.append({"role": role, "content": text.strip()}
                            | ({"cut": True} if cut and role == "assistant" else {}))

    kept = [messages.pop(0)] if messages and messages[0]["role"] == "system" else []
    position = 0
    while position < len(messages):
        role = messages[position]["role"]
        if (role == "user" and position + 1 < len(messages)
                and messages[position + 1]["role"] == "assistant"):
            kept += messages[position: position + 2]
            position += 2
            continue
        stats.dropped_turns[UNPAIRED[role]] += 1
        position += 1
    if not kept or kept[-1]["role"] != "assistant":
        stats.dropped_conversations["no user/assistant pair"] += 1
        return None
    stats.kept += 1
    record_id = record.get("id")
    conv_id = str(record_id) if record_id not in (None, "") else fallback_id
    return Conversation(conv_id, tuple(kept))


def clean_records(
    records: Iterable[dict], source_name: str, stats: CleaningStats
) -> Iterator[Conversation]:
    """Clean records lazily; ids default to `<source_name>:<position>`."""
    for position, record in enumerate(records):
        conversation = clean_record(record, f"{source_name}:{position}", stats)
        if conversation is not None:
            yield conversation


def keep_first_pairs(conversation: Conversation, max_pairs: int | None) -> Conversation:
    """The conversation cut after its first `max_pairs` user/assistant exchanges (None: whole)."""
    if max_pairs is None or conversation.num_pairs <= max_pairs:
        return conversation
    offset = 1 if conversation.system is not None else 0
    return Conversation(conversation.id, conversation.messages[: offset + 2 * max_pairs])
