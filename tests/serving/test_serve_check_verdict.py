"""The serve-check's verdict in words: a low engine acceptance is blamed on the export only when
draftsmith's own loop, on the same prompts, accepted clearly more."""

from __future__ import annotations

from draftsmith.serving.serve_check import ServeCheckSettings, failures


def summary(engine_rate: float, loop_rate: float | None) -> dict:
    result = {"identical": [30, 30], "records": [],
              "engine_stats": {"acceptance": engine_rate, "accepted_tokens": 112,
                               "draft_tokens": 4999}}
    if loop_rate is not None:
        result["draftsmith"] = {"acceptance": loop_rate}
    return result


def test_a_weak_drafter_that_the_loop_agrees_with_is_named_as_such():
    (problem,) = failures(summary(0.022, 0.019), ServeCheckSettings())
    assert "accepted 112 of 4999 draft tokens (2.2% < --min-acceptance 5%)" in problem
    assert "own loop accepted 1.9% on the same prompts: the export and the engine agree" in problem


def test_an_engine_far_below_the_loop_or_without_one_blames_the_export():
    for loop in (0.30, None, 0.0):
        (problem,) = failures(summary(0.022, loop), ServeCheckSettings())
        assert "the export and the engine disagree. Usual causes: aux layer ids" in problem, loop
    assert failures(summary(0.30, 0.31), ServeCheckSettings()) == []


def differing(gap: float | None, first: int = 6) -> dict:
    record = {"set": "mt_bench", "id": "81", "identical": False, "first_difference": first}
    if gap is not None:
        record.update(plain_token=11, spec_token=12, tie_gap=gap)
    return record


def test_a_divergence_at_a_near_tie_is_shown_but_does_not_fail():
    """The engine's kernels differ between a multi-token verify and a one-token step: where the
    target's own float32 logits of the two tokens are within TIE_GAP, it is a flipped near-tie."""
    from draftsmith.serving.serve_check import TIE_GAP, near_tie_note

    result = summary(0.30, 0.31)
    result["identical"] = [28, 30]
    result["records"] = [differing(0.004), differing(TIE_GAP)]
    result["draft_types"] = {"q8_0": {"identical": [29, 30], "differing": [differing(0.01)]}}
    assert failures(result, ServeCheckSettings()) == []
    assert near_tie_note(result["records"]) == (
        f" (2 part at near-ties: the target's float32 logit gaps 0.004, {TIE_GAP:.3g} <= "
        f"{TIE_GAP})")
    assert near_tie_note([]) == ""


def test_a_divergence_beyond_a_near_tie_or_unmeasured_fails():
    result = summary(0.30, 0.31)
    result["identical"] = [28, 30]
    result["records"] = [differing(0.004), differing(1.7, first=9)]
    (problem,) = failures(result, ServeCheckSettings())
    assert "differ from plain decoding in the engine on 1 of 30 prompts beyond a near-tie" in problem
    assert "mt_bench/81 at new token 9, the target's float32 logit gap 1.7 > 0.05" in problem
    result["records"] = [differing(None)]  # one answer ended early: nothing to measure
    (problem,) = failures(result, ServeCheckSettings())
    assert "1 of 30 prompts beyond a near-tie (first: mt_bench/81 at new token 6)" in problem
    result["records"] = []
    result["draft_types"] = {"f16": {"identical": [29, 30], "differing": [differing(0.2)]}}
    (problem,) = failures(result, ServeCheckSettings())
    assert problem.startswith("with the f16 draft GGUF, greedy outputs differ from plain "
                              "decoding in the engine on 1 of 30 prompts beyond a near-tie")


def test_the_gap_is_the_targets_float32_logit_difference_where_the_answers_part(tiny_folder):
    import torch
    from transformers import AutoModelForCausalLM

    from draftsmith.serving.serve_check_loop import divergence_gaps
    from draftsmith.target.load import load_target

    model = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32).eval()
    prompt, shared = [5, 9, 17], [23, 4]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + shared])).logits[0, -1]
    top = logits.topk(2).indices.tolist()
    target = load_target(str(tiny_folder), dtype="float32")
    gaps = divergence_gaps(target, [(prompt, shared, top[0], top[1]),
                                    (prompt, [], top[1], top[0])])
    assert gaps[0] == round(float(logits[top[0]] - logits[top[1]]), 5) > 0
    assert gaps[1] >= 0 and len(gaps) == 2
