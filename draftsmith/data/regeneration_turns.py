"""One shard of regeneration, answered turn by turn: round k asks the backend for every
conversation's k-th answer, given the conversation so far with the target's own earlier answers
(`regenerate.py` runs the shards). A conversation stops early when its prompt reaches
`max_length` or an answer comes back empty (skipped, or kept with the turns answered before),
or fails when the backend refuses its request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tqdm.auto import tqdm

from draftsmith.data.conversations import Conversation
from draftsmith.data.render import prompt_ids
from draftsmith.data.server_client import Reply


def _prompt_messages(conversation: Conversation, answers: list[str]) -> list[dict]:
    """System prompt, then user turns interleaved with the answers so far, ending with a user turn."""
    system = conversation.messages[:1] if conversation.system is not None else ()
    messages = [dict(m) for m in system]
    for turn, user in enumerate(conversation.user_turns[: len(answers) + 1]):
        messages.append({"role": "user", "content": user})
        if turn < len(answers):
            messages.append({"role": "assistant", "content": answers[turn]})
    return messages


class _ShardTurns:
    """Where each conversation of one shard stands between rounds of `regenerate_shard`: its
    answers so far and how each ended, and why it stopped early (`cut`: skipped, or kept with
    the turns answered before; `failed`: the backend refused it)."""

    def __init__(self, conversations: Sequence[Conversation], first_index: int):
        self.conversations, self.first_index = conversations, first_index
        self.answers: list[list[str]] = [[] for _ in conversations]
        self.stops: list[list[str]] = [[] for _ in conversations]
        self.alive = [True] * len(conversations)
        self.cut: dict[int, str] = {}  # why a conversation stopped before its last turn
        self.failed: dict[int, str] = {}
        self.new_tokens = 0

    def requests(self, turn: int, tokenizer, template: str, max_length: int,
                 ) -> tuple[list[int], list[tuple[int, list[dict], list[int]]]]:
        """Round `turn`'s requests (`(key, messages, prompt_ids)`) and the conversations they
        are for; a conversation whose prompt reached `max_length` stops here."""
        pending, requests = [], []
        for i, conversation in enumerate(self.conversations):
            if not self.alive[i] or conversation.num_pairs <= turn:
                continue
            messages = _prompt_messages(conversation, self.answers[i])
            ids = prompt_ids(tokenizer, messages, template)
            if len(ids) >= max_length:
                self.alive[i] = False
                self.cut[i] = "prompt reached max_length"
                continue
            pending.append(i)
            requests.append(((self.first_index + i) * 64 + turn, messages, ids))
        return pending, requests

    def take(self, pending: Sequence[int], replies: Sequence[Reply]) -> None:
        """Record one round's replies: an error fails its conversation, an empty answer stops
        it."""
        for i, reply in zip(pending, replies, strict=True):
            if reply.error is not None:
                self.alive[i] = False
                self.failed[i] = reply.error
                continue
            self.new_tokens += reply.tokens
            text = reply.text.strip()
            if not text:
                self.alive[i] = False
                self.cut[i] = "empty answer"
                continue
            self.answers[i].append(text)
            self.stops[i].append(reply.stop)

    def records(self) -> tuple[list[dict], Counter]:
        """The output records in input order (an answer cut at the cap marked `"cut": true`),
        and the skip counts by reason (each conversation counted once)."""
        records, dropped = [], Counter()
        for i, conversation in enumerate(self.conversations):
            if i in self.failed:
                continue
            answers, stops = self.answers[i], self.stops[i]
            if not answers:
                dropped[self.cut.get(i, "no answer")] += 1
                continue
            if i in self.cut:  # kept with the turns answered before the cut
                dropped[f"later turns cut ({self.cut[i]}), conversation kept"] += 1
            messages = _prompt_messages(conversation, answers[:-1])
            messages.append({"role": "assistant", "content": answers[-1]})
            assistant = [m for m in messages if m["role"] == "assistant"]
            for message, stop in zip(assistant, stops, strict=True):
                if stop == "max_new_tokens":
                    message["cut"] = True
            records.append({"id": conversation.id, "index": self.first_index + i,
                            "messages": messages, "stops": stops})
        return records, dropped

    def failures(self) -> list[dict]:
        """The failed conversations (`{"index", "id", "error"}`), in input order."""
        return [{"index": self.first_index + i, "id": self.conversations[i].id, "error": error}
                for i, error in sorted(self.failed.items())]


def regenerate_shard(
    respond, tokenizer, conversations: Sequence[Conversation], first_index: int, *,
    template: str, max_length: int, progress: tqdm | None = None,
) -> tuple[list[dict], int, Counter, list[dict]]:
    """Regenerate one shard turn by turn (round k answers every conversation's k-th user turn).

    Args:
        respond: a backend (`InProcessResponder`, `ServerResponder`): a list of
            `(key, messages, prompt_ids)` requests in, one `Reply` per request out.

    Returns:
        the output records in input order, the number of generated tokens (EOS included), the
        skip counts by reason, and the failed conversations (`{"index", "id", "error"}`).
    """
    turns = _ShardTurns(conversations, first_index)
    for turn in range(max(c.num_pairs for c in conversations)):
        pending, requests = turns.requests(turn, tokenizer, template, max_length)
        turns.take(pending, respond(requests))
        if progress is not None:
            progress.set_postfix(turn=turn + 1, new_tokens=turns.new_tokens, refresh=False)
    records, dropped = turns.records()
    return records, turns.new_tokens, dropped, turns.failures()
