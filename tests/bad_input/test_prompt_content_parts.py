"""OpenAI `messages` whose content is a list of parts (a valid OpenAI shape) were refused as
having no user turn by `eval --prompts`: text parts are joined, other parts refused by name
(issue #55)."""

from __future__ import annotations

import json

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.eval.prompts.files import load_prompt_file
from tests.helpers.cli import assert_refused, run_cli


def write_records(tmp_path, *records):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in records))
    return path


def test_text_parts_are_joined_into_the_turn(tmp_path):
    path = write_records(tmp_path, [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Name a prime "},
                                     {"type": "text", "text": "above 10."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "11"}]},
        {"role": "user", "content": "And one above 20?"}])
    [prompt] = load_prompt_file(path)
    assert prompt.turns == ("Name a prime above 10.", "And one above 20?")


def test_non_text_parts_are_refused_by_type(tmp_path, tiny_folder):
    path = write_records(tmp_path, [{"role": "user", "content": [
        {"type": "text", "text": "What is in it?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
    with pytest.raises(DraftsmithError, match=r"chats.jsonl:1: message 1 has content parts of "
                                              r"type image_url; evaluation prompts are text only"):
        load_prompt_file(path)
    result = run_cli(["eval", "--target", str(tiny_folder), "--dtype", "float32", "--prompts",
                      str(path), "--out", str(tmp_path / "eval")])
    assert_refused(result, "content parts of type image_url", "keep its")
