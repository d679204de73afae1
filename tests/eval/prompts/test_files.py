"""The user's prompt files: Spec-Bench / MT-bench JSONL, OpenAI messages JSONL, plain text."""

from __future__ import annotations

import json

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.eval.prompts.files import load_prompt_file


def write(path, rows):
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


def test_spec_bench_shape_keeps_categories_turns_and_ids(tmp_path):
    path = write(tmp_path / "question.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
        {"question_id": 82, "category": "writing", "turns": ["Write a haiku."]},
        {"question_id": 5, "category": "translation", "turns": ["Translate: Hallo"]},
    ])
    prompts = load_prompt_file(path)
    assert [(p.set_name, p.item_id, p.turns) for p in prompts] == [
        ("writing", "81", ("Write a poem.", "Shorter.")), ("writing", "82", ("Write a haiku.",)),
        ("translation", "5", ("Translate: Hallo",))]
    assert [p.item_id for p in load_prompt_file(path, limit=1)] == ["81", "5"]  # per category


def test_openai_messages_ask_the_user_turns_in_order(tmp_path):
    path = write(tmp_path / "traffic.jsonl", [{"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "recorded answer, replaced"},
        {"role": "user", "content": "And then?"}]}])
    [prompt] = load_prompt_file(path)
    assert prompt.set_name == "traffic" and prompt.turns == ("Hi", "And then?")


def test_plain_text_one_prompt_per_line(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("First prompt\n\n  Second prompt  \n")
    assert [(p.set_name, p.turns) for p in load_prompt_file(path)] == [
        ("mine", ("First prompt",)), ("mine", ("Second prompt",))]


@pytest.mark.parametrize("rows,message", [
    ([{"turns": ["ok"]}, "{not json"], r"bad.jsonl:2: not valid JSON"),
    ([{"turns": ["ok"]}, [1, 2]], r"bad.jsonl:2: each line must be a JSON object, not list"),
    ([{"prompt": "x"}], r"bad.jsonl:1: a record needs `turns` .* or `messages`"),
    ([{"turns": []}], r"bad.jsonl:1: needs at least one non-empty user turn"),
    ([{"messages": [{"role": "assistant", "content": "x"}]}], r"bad.jsonl:1: needs at least one"),
    ([], r"holds no prompts"),
])
def test_bad_files_name_the_line(tmp_path, rows, message):
    with pytest.raises(DraftsmithError, match=message):
        load_prompt_file(write(tmp_path / "bad.jsonl", rows))


def test_missing_file_names_the_shapes(tmp_path):
    with pytest.raises(DraftsmithError, match="does not exist; pass a Spec-Bench"):
        load_prompt_file(tmp_path / "nope.jsonl")
