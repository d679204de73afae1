"""draftsmith's own lossless loop on the prompts and drafter of a serve-check: the other column.

The target's Hugging Face folder is loaded in float32, the export with `load_any_drafter`, and each
prompt is decoded greedily with a chain of the engine's draft length, so the engine's tau and
acceptance per draft position compare with the loop's like for like.
"""

from __future__ import annotations

from pathlib import Path


def loop_acceptance(target_dir: Path, export_dir: Path, prompts: list[list[int]],
                    max_new_tokens: int, draft_max: int, device: str = "cpu") -> dict:
    """tau, acceptance per draft position, tokens/s and the answers of draftsmith's loop."""
    from draftsmith.decoding.decode import generate
    from draftsmith.decoding.runner import CausalLMRunner
    from draftsmith.eval.methods import ProposerSettings, make_drafter_proposer
    from draftsmith.export.load import load_any_drafter
    from draftsmith.target import load_target

    target = load_target(str(target_dir), dtype="float32", device=device)
    drafter = load_any_drafter(export_dir, target.model)
    runner = CausalLMRunner(target.model, output_hidden_states=True)
    settings = ProposerSettings(num_draft_tokens=draft_max)
    results = [generate(runner, make_drafter_proposer("drafter_chain", drafter, settings), ids,
                        max_new_tokens, target.eos_token_ids) for ids in prompts]
    steps = sum(r.steps for r in results)
    tokens = sum(len(r.tokens) for r in results)
    accepted = [a for r in results for a in r.accepted_per_step]
    drafted = [d for r in results for d in r.depth_per_step]
    per_position = []
    for k in range(draft_max):
        reached = sum(1 for d in drafted if d > k)
        per_position.append(round(sum(1 for a in accepted if a > k) / reached, 4) if reached else 0.0)
    seconds = sum(r.decode_seconds for r in results)
    return {"tau": round(tokens / max(steps, 1), 4),
            "acceptance": round(sum(accepted) / max(sum(drafted), 1), 4),
            "acceptance_per_position": per_position,
            "tokens_per_second": round(tokens / seconds, 2) if seconds > 0 else 0.0,
            "dtype": "float32", "answers": [r.tokens for r in results]}
