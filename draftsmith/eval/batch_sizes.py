"""`draftsmith eval --batch-size 1,2,4,8`: plain decoding and the chain methods on batches of the
same prompt turns batch 1 ran, with tokens/s and speedup against plain decoding per batch size.

Batch 1 is the ordinary evaluation (its single-sequence loop); every larger batch size runs each
chain method on consecutive groups of the prompt turns, method after method on each group so they
share the machine's conditions. Tree methods run at batch 1 only for now and are skipped above it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from draftsmith.decoding.batched import TREES_AT_BATCH_1
from draftsmith.eval.executor import MethodExecutor
from draftsmith.eval.hf_baselines import HF_METHODS
from draftsmith.eval.lossless import first_divergence
from draftsmith.eval.methods import Method, decodes_chains


@dataclass
class BatchRecord:
    """One batch of prompt turns decoded by one method at one batch size."""

    method: str
    batch_size: int
    rows: int
    new_tokens: int
    step_tokens: int  # new tokens the steps emitted (each row's first comes from the prefill)
    row_steps: int  # target steps summed over rows (tau = step_tokens / row_steps)
    steps: int  # batched target forwards
    total_seconds: float
    prefill_seconds: float
    draft_seconds: float
    verify_seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Turn:
    """A prompt turn of the batch-1 run: where it comes from, its tokens, plain's answer."""

    set_name: str
    item_id: str
    turn: int
    prompt_ids: list[int]
    reference: list[int]


def batch_methods(methods, drafters: dict) -> tuple[list[str], dict[str, str]]:
    """(methods that run at batch > 1, {skipped method: why}); `drafters`: label -> (drafter, _)."""
    chains, skipped = [], {}
    for method in methods:
        label = Method.parse(method).label
        kind = drafters[label][0].kind if label in drafters else None
        if method in HF_METHODS:
            skipped[method] = "Hugging Face baselines run at batch 1 only"
        elif decodes_chains(method, kind):
            chains.append(method)
        else:
            skipped[method] = TREES_AT_BATCH_1
    return chains, skipped


def run_batch_sizes(executor: MethodExecutor, turns: list[Turn], warm: list[int], log=print
                    ) -> tuple[list[BatchRecord], dict[str, dict], dict[str, str]]:
    """Every chain method at every batch size above 1 of `executor.config.batch_sizes`.

    Args:
        executor: the run's executor (models, drafters, settings).
        turns: the prompt turns batch 1 decoded, with plain decoding's answers.
        warm: a short prompt for the first call of each method and batch size (one-time costs).
        log: where notes go.

    Returns:
        (records, first divergence from plain's batch-1 answer per "METHOD (batch B)" in greedy
        runs, {skipped method: why}).
    """
    config = executor.config
    methods, skipped = batch_methods(config.methods, executor.drafters)
    for method, why in skipped.items():
        log(f"--batch-size: {method} runs at batch 1 only ({why})")
    records, divergent = [], {}
    for size in [b for b in config.batch_sizes if b > 1]:
        if size > len(turns):
            log(f"--batch-size {size}: only {len(turns)} prompt turns, so batches hold "
                f"{len(turns)} rows (raise --limit for full batches)")
        for method in methods:
            executor.run_batch(method, [warm] * min(size, len(turns)), 8)
        for start in range(0, len(turns), size):
            group = turns[start:start + size]
            for method in methods:
                result = executor.run_batch(method, [t.prompt_ids for t in group],
                                            config.max_new_tokens)
                records.append(BatchRecord(
                    method, size, len(group), result.new_tokens, result.step_tokens,
                    sum(r.steps for r in result.rows), result.steps, result.total_seconds,
                    result.prefill_seconds, result.draft_seconds, result.verify_seconds))
                key = f"{method} (batch {size})"
                for turn, row in zip(group, result.rows, strict=True):
                    if (config.sampling.greedy and row.tokens != turn.reference
                            and key not in divergent):
                        divergent[key] = first_divergence(executor.target.tokenizer, turn.reference,
                                                         row.tokens, turn, turn.turn)
    return records, divergent, skipped

