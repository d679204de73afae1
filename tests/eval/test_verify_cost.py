"""`draftsmith machine`'s verify-cost curve: which linear forms it measures and how the curve reads
where the few-row form does not apply (a bf16 target)."""

from types import SimpleNamespace

import torch

from draftsmith.eval.verify_cost import format_curve, measure_machine, single_curve
from tests.helpers.tiny_targets import tiny_target


def _payload(limits: dict) -> dict:
    return {"few_row_limits": limits, "curves": {"default": {1: 50.0, 2: 60.0, 8: 66.0},
                                                 "few_row": {1: 45.0, 2: 62.0, 8: 55.0}}}


def test_a_bfloat16_target_is_measured_in_one_form():
    target = SimpleNamespace(model=tiny_target("llama", dtype=torch.bfloat16), spec="tiny",
                             dtype_choice=None)
    payload = measure_machine(target, sizes=(1, 2), context_len=8, repeats=1, rounds=1)
    assert list(payload["curves"]) == ["default"] and payload["few_row_limits"] == {}
    assert set(payload["curves"]["default"]) == {1, 2}
    assert format_curve(payload).startswith("| new tokens | ms | / 1 token |")


def test_without_the_few_row_form_both_recorded_forms_are_one_curve():
    # an older payload measured the same code twice: the curve is the minimum per size
    payload = _payload({})
    assert single_curve(payload) == {1: 45.0, 2: 60.0, 8: 55.0}
    lines = format_curve(payload).splitlines()
    assert lines[0] == "| new tokens | ms | / 1 token |"
    assert lines[3] == "| 2 | 60.0 | 1.33x |"


def test_with_the_few_row_form_both_columns_are_shown():
    payload = _payload({"576x576": 4})
    assert single_curve(payload) is None
    lines = format_curve(payload).splitlines()
    assert lines[0].startswith("| new tokens | default ms |") and "few-row ms" in lines[0]
    assert lines[3] == "| 2 | 60.0 | 1.20x | 62.0 | 1.38x |"
