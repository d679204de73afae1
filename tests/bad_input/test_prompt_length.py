"""Prompts that with their answers and draft do not fit the target's context are refused by
`draftsmith eval` before any weights load, once, per prompt set with the count and the longest
item, and with the `--max-new-tokens` that fits every prompt when one does (issue #18)."""

from __future__ import annotations

import json

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.eval.config import build_eval_config
from draftsmith.eval.prompts.sets import BenchPrompt
from draftsmith.eval.prompts_fit import check_eval_prompts_fit, check_prompts_fit
from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.tiny_tokenizers import char_tokenizer

CONTEXT = 512  # the tiny target's max_position_embeddings; the tokenizer: one token a character
MARGIN = 17  # the default settings' longest draft (16: tree, REST, lookahead) + the bonus token


def prompt_file(tmp_path, *lengths):
    path = tmp_path / "long.txt"
    path.write_text("".join("a" * n + "\n" for n in lengths))
    return path


def eval_args(tmp_path, folder, prompts, *extra):
    return ["eval", "--target", str(folder), "--dtype", "float32", "--prompts", str(prompts),
            "--out", str(tmp_path / "eval"), *extra]


def test_a_prompt_too_long_without_any_answer_is_refused(tmp_path, tiny_folder):
    path = prompt_file(tmp_path, 20, 600, 30)
    result = run_cli(eval_args(tmp_path, tiny_folder, path, "--max-new-tokens", "16"))
    assert_refused(result, f"longer than the target's context of {CONTEXT} tokens",
                   f"--max-new-tokens 16 per turn + {MARGIN} draft tokens",
                   "1 of 3 prompts of long (longest: 2, ",
                   "remove the prompts that are too long even without an answer",
                   "--limit, or edit the prompt file")
    assert not (tmp_path / "eval").exists()


def test_the_suggested_max_new_tokens_fits_and_one_more_does_not(tmp_path, tiny_folder):
    path = prompt_file(tmp_path, 300, 10)
    result = run_cli(eval_args(tmp_path, tiny_folder, path, "--max-new-tokens", "128"))
    line = assert_refused(result, "1 of 2 prompts of long (longest: 1, ")
    fits = int(line.split("set --max-new-tokens ")[1].split()[0])
    assert 1 <= fits < 128
    for max_new_tokens, ok in ((fits, True), (fits + 1, False)):
        config = build_eval_config(target=str(tiny_folder), dtype="float32", bench=(),
                                   prompt_files=(str(path),), max_new_tokens=max_new_tokens,
                                   out_dir=str(tmp_path / "eval"))
        if ok:
            check_eval_prompts_fit(config)
        else:
            with pytest.raises(DraftsmithError, match="1 of 2 prompts of long"):
                check_eval_prompts_fit(config)


def test_later_turns_count_the_earlier_answers_and_sets_are_reported_apart(tmp_path):
    tokenizer = char_tokenizer()
    two_turns = BenchPrompt("mt", "81", ("a" * 100, "b" * 100))
    one_turn = BenchPrompt("code", "7", ("c" * 100,))
    check_prompts_fit(tokenizer, [two_turns, one_turn], 1000, 300, 1)  # 2 turns + 2 answers fit
    with pytest.raises(DraftsmithError) as refused:
        check_prompts_fit(tokenizer, [two_turns, one_turn], 1000, 400, 1)
    message = str(refused.value)
    assert "1 of 1 prompts of mt (longest: 81, " in message and "of code" not in message
    with pytest.raises(DraftsmithError) as refused:
        check_prompts_fit(tokenizer, [two_turns, one_turn, BenchPrompt("code", "8", ("c" * 900,))],
                          1000, 400, 1)
    assert "1 of 1 prompts of mt" in str(refused.value)
    assert "1 of 2 prompts of code (longest: 8, " in str(refused.value)


def test_a_target_without_a_context_length_is_not_checked():
    check_prompts_fit(char_tokenizer(), [BenchPrompt("s", "1", ("a" * 5000,))], None, 128, 17)


def test_a_jsonl_prompt_file_names_its_category_and_ids(tmp_path, tiny_folder):
    path = tmp_path / "questions.jsonl"
    rows = [{"question_id": 1, "category": "writing", "turns": ["x" * 30]},
            {"question_id": 2, "category": "writing", "turns": ["y" * 450]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_cli(eval_args(tmp_path, tiny_folder, path, "--max-new-tokens", "64"))
    assert_refused(result, "1 of 2 prompts of writing (longest: 2, ")
