"""Evaluation prompts: the built-in sets and the user's own files (`draftsmith eval --prompts FILE`),
gathered into one list (`gather_prompts`).

Three shapes, told apart by the content:
  * JSONL in the Spec-Bench / MT-bench shape: `{"question_id": ..., "category": ..., "turns":
    ["first user turn", "second", ...]}` (Spec-Bench's `question.jsonl`: translation,
    summarization, QA, math reasoning, RAG and MT-bench, 480 prompts);
  * JSONL of OpenAI chat records: `{"messages": [{"role": "user", "content": ...}, ...]}`; the user
    turns are asked in order and the recorded assistant turns are replaced by the model's own;
  * plain text: one prompt per line (blank lines skipped).
Results are reported per `category` when the file has one, else per file (its stem).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from draftsmith.data.conversations import content_text
from draftsmith.errors import DraftsmithError
from draftsmith.eval.prompts.sets import PROMPT_SETS, BenchPrompt, load_prompts


def _turns_of(row: dict, where: str) -> tuple[str, ...]:
    if "turns" in row:
        turns = row["turns"]
        if isinstance(turns, str):
            turns = [turns]
    elif "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise DraftsmithError(f"{where}: `messages` must be a list of {{role, content}} "
                                  "objects")
        turns = [_user_text(m.get("content"), number, where)
                 for number, m in enumerate(messages, 1) if m.get("role") == "user"]
    else:
        raise DraftsmithError(f"{where}: a record needs `turns` (Spec-Bench / MT-bench shape) or "
                              f"`messages` (OpenAI chat shape); it has {sorted(row)}")
    if not isinstance(turns, list) or not turns or not all(
            isinstance(t, str) and t.strip() for t in turns):
        raise DraftsmithError(f"{where}: needs at least one non-empty user turn (text)")
    return tuple(turns)


def _user_text(content, number: int, where: str):
    """A user message's text: a string, or OpenAI's list of text parts joined; a part of another
    type (an image) is refused, as the prompts are text."""
    text = content_text(content)
    if text is None and isinstance(content, list):
        kinds = sorted({str(p.get("type")) if isinstance(p, dict) else type(p).__name__
                        for p in content} - {"text"})
        if kinds:
            raise DraftsmithError(f"{where}: message {number} has content parts of type "
                                  f"{', '.join(kinds)}; evaluation prompts are text only: keep "
                                  'its {"type": "text", "text": ...} parts or drop the record')
    return text if text is not None else content


def load_prompt_file(path: str | Path, limit: int | None = None) -> list[BenchPrompt]:
    """The prompts of one file, at most `limit` per category (per file when it has none).

    Raises:
        DraftsmithError: a missing or unreadable file, or a bad line (named with its number).
    """
    path = Path(path)
    if not path.is_file():
        raise DraftsmithError(f"prompt file {path} does not exist; pass a Spec-Bench / MT-bench "
                              "question.jsonl, a JSONL of OpenAI `messages`, or a text file with "
                              "one prompt per line")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DraftsmithError(f"prompt file {path} is not UTF-8 text (byte {err.start})") from None
    content = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not content:
        raise DraftsmithError(f"prompt file {path} holds no prompts")
    as_json = path.suffix in (".jsonl", ".json") or content[0][1].lstrip().startswith("{")
    prompts, per_set = [], Counter()
    for number, line in content:
        where = f"{path}:{number}"
        if as_json:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DraftsmithError(f"{where}: not valid JSON ({err.msg}); each line must be "
                                      "one JSON object") from None
            if not isinstance(row, dict):
                raise DraftsmithError(f"{where}: each line must be a JSON object, not "
                                      f"{type(row).__name__}")
            turns = _turns_of(row, where)
            set_name = str(row.get("category") or path.stem)
            item_id = str(row.get("question_id", row.get("id", number)))
        else:
            turns, set_name, item_id = (line.strip(),), path.stem, str(number)
        if limit is not None and per_set[set_name] >= limit:
            continue
        per_set[set_name] += 1
        prompts.append(BenchPrompt(set_name, item_id, turns))
    return prompts


def gather_prompts(sets, files, limit: int | None) -> list[BenchPrompt]:
    """The first `limit` items of each built-in set, then of each prompt file (per category).

    Raises:
        DraftsmithError: an unknown set name (listing the sets), or a bad prompt file.
    """
    unknown = [name for name in sets if name not in PROMPT_SETS]
    if unknown:
        raise DraftsmithError(f"unknown prompt set(s) {unknown}; choose from: "
                              f"{', '.join(PROMPT_SETS)}")
    return [*(p for name in sets for p in load_prompts(name, limit)),
            *(p for path in files for p in load_prompt_file(path, limit))]
