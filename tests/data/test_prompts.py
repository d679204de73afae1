"""Evaluation prompt sets load offline from their data wheels."""

import pytest

from draftsmith.data.prompts import load_prompts
from draftsmith.errors import DraftsmithError


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
