"""draftsmith's own lossless loop on the prompts and drafter of a serve-check: the other column.

The target's Hugging Face folder is loaded in float32, the export with `load_any_drafter`, and each
prompt is decoded greedily with a chain of the engine's draft length, so the engine's tau and
acceptance per draft position compare with the loop's like for like. llama.cpp samples the first
new token from its prompt pass and drafts from the second on, where the loop's first step already
verifies a draft after the prompt's last token: for llama.cpp the loop's acceptance counts its
drafts from the second step too (measured on one prompt: the engine 6 drafts, the loop 7, the
same 17 tokens accepted).
"""

from __future__ import annotations

from pathlib import Path


def loop_acceptance(target, export_dir: Path, prompts: list[list[int]],
                    max_new_tokens: int, draft_max: int, first_step_drafts: bool = True) -> dict:
    """tau, acceptance per draft position, tokens/s and the answers of draftsmith's loop;
    `first_step_drafts` False leaves each prompt's first step out of the acceptance (as llama.cpp
    counts: it does not draft there). `target`: the target loaded in float32."""
    from draftsmith.decoding.decode import generate
    from draftsmith.decoding.runner import CausalLMRunner
    from draftsmith.eval.methods import make_drafter_proposer
    from draftsmith.eval.settings import DecodeSettings
    from draftsmith.export.load import load_any_drafter

    drafter = load_any_drafter(export_dir, target.model)
    runner = CausalLMRunner(target.model, output_hidden_states=True)
    settings = DecodeSettings(num_draft_tokens=draft_max)
    results = [generate(runner, make_drafter_proposer("drafter_chain", drafter, settings), ids,
                        max_new_tokens, target.eos_token_ids) for ids in prompts]
    steps = sum(r.steps for r in results)
    tokens = sum(len(r.tokens) for r in results)
    skip = 0 if first_step_drafts else 1
    accepted = [a for r in results for a in r.accepted_per_step[skip:]]
    drafted = [d for r in results for d in r.depth_per_step[skip:]]
    # as the engines count: drafts with position k accepted over all drafts (a draft cut short by
    # the token budget counts as a miss at the positions it did not reach)
    drafts = sum(1 for d in drafted if d > 0)
    per_position = [round(sum(1 for a in accepted if a > k) / drafts, 4) if drafts else 0.0
                    for k in range(draft_max)]
    seconds = sum(r.decode_seconds for r in results)
    return {"tau": round(tokens / max(steps, 1), 4),
            "acceptance": round(sum(accepted) / max(sum(drafted), 1), 4),
            "draft_tokens": sum(drafted), "accepted_tokens": sum(accepted),
            "drafts": drafts,
            "acceptance_per_position": per_position,
            "tokens_per_second": round(tokens / seconds, 2) if seconds > 0 else 0.0,
            "counted_from_step": 1 + skip, "dtype": "float32",
            "answers": [r.tokens for r in results]}


def divergence_gaps(target, cases: list[tuple[list[int], list[int], int, int]]) -> list[float]:
    """How close the target (float32) is to a tie where the engine's two decodings part.

    Args:
        target: the target loaded in float32.
        cases: (prompt ids, the answer tokens both decodings share, the plain decoding's next
            token, the speculative decoding's next token), one per divergence.

    Returns:
        Per case, |logit(plain token) - logit(speculative token)| of the target's float32 forward
        on prompt + shared answer: ~0 where the engine's kernels (a multi-token verify against a
        one-token step) flipped a near-tie, large where speculation changed what the target chose.
    """
    import torch

    gaps = []
    with torch.inference_mode():
        for prompt, shared, plain, spec in cases:
            ids = torch.tensor([prompt + shared], device=target.model.device)
            logits = target.model(ids, logits_to_keep=1).logits[0, -1].float()
            gaps.append(round(abs(float(logits[plain] - logits[spec])), 5))
    return gaps
