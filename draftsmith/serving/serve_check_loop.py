"""draftsmith's own lossless loop on the prompts and drafter of a serve-check: the other column.

The target's Hugging Face folder is loaded in float32, the export with `load_any_drafter`, and each
prompt is decoded greedily with a chain of the engine's draft length, so the engine's tau and
acceptance per draft position compare with the loop's like for like. The loop takes the first new
token from the prefill and drafts from there (decoding/decode.py since commit 578a187), as
llama.cpp and vLLM do, so every draft counts for either engine (llama.cpp's gate: the same
drafts and accepted tokens as the engine's counters).
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.eval.settings import DecodeSettings


def loop_acceptance(target, export_dir: Path, prompts: list[list[int]],
                    max_new_tokens: int, settings: DecodeSettings) -> dict:
    """tau, acceptance per draft position, tokens/s and the answers of draftsmith's loop.
    `target`: the target loaded in float32; `settings`: eval's decoding settings, the chain
    (`num_draft_tokens`) the engine's draft length."""
    from draftsmith.decoding.decode import generate
    from draftsmith.decoding.runner import CausalLMRunner
    from draftsmith.eval.methods import make_drafter_proposer
    from draftsmith.export.load import load_any_drafter

    drafter = load_any_drafter(export_dir, target.model)
    runner = CausalLMRunner(target.model, output_hidden_states=True)
    draft_max = settings.num_draft_tokens
    results = [generate(runner, make_drafter_proposer("drafter_chain", drafter, settings), ids,
                        max_new_tokens, target.eos_token_ids) for ids in prompts]
    steps = sum(r.steps for r in results)
    tokens = sum(len(r.tokens) for r in results)
    accepted = [a for r in results for a in r.accepted_per_step]
    drafted = [d for r in results for d in r.depth_per_step]
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
            "counted_from_step": 1, "dtype": "float32",
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
