"""Evaluation prompt sets load offline from their data wheels."""

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.eval.prompts.sets import load_prompts


def test_prompt_sets_load_with_their_shapes():
    mt = load_prompts("mt_bench")
    assert len(mt) == 80 and all(len(p.turns) == 2 for p in mt)
    he = load_prompts("humaneval", limit=3)
    assert len(he) == 3 and "def has_close_elements" in he[0].turns[0]
    gsm = load_prompts("gsm8k", limit=2)
    assert "Janet" in gsm[0].turns[0]


def test_unknown_set_lists_the_choices():
    with pytest.raises(DraftsmithError, match="mt_bench"):
        load_prompts("mmlu")


def test_chosen_sets_and_an_unknown_set():
    from draftsmith.errors import DraftsmithError
    from draftsmith.eval.prompts.files import gather_prompts
    from draftsmith.eval.prompts.sets import chosen_sets

    assert chosen_sets(None, has_files=False) == ("mt_bench", "humaneval", "gsm8k")
    assert chosen_sets(None, has_files=True) == ()
    assert chosen_sets(" gsm8k, humaneval ", has_files=True) == ("gsm8k", "humaneval")
    with pytest.raises(DraftsmithError, match=r"unknown prompt set\(s\) \['gsm9k'\]; choose from"):
        gather_prompts(("gsm9k",), (), 1)
