"""The speculative decoding loop for a batch of prompts at once, with per-row acceptance (chains).

Each row has its own proposer; the target verifies every row's chain in one batched forward
(`BatchedLMRunner`), and each row accepts its own number of tokens, verified exactly as the
single-sequence loop (`decode.generate`) does, the first token from the prefill included, so
with greedy verification every row's output is that row's plain greedy output. Rows leave the
batch when they reach EOS or their budget. Trees run at batch 1 only for now: a proposer that
returns a tree is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.decoding.batched_runner import BatchedLMRunner
from draftsmith.decoding.decode import GenerationResult, clock, emitted_tokens
from draftsmith.decoding.proposers.base import Proposer
from draftsmith.decoding.sampling import SamplingConfig, choose_token
from draftsmith.decoding.verify import verify
from draftsmith.errors import DraftsmithError

TREES_AT_BATCH_1 = "trees run at batch 1 only for now (use a chain method, e.g. drafter_chain)"


@dataclass
class BatchResult:
    """One batch's outputs and where its time went.

    Attributes:
        rows: per prompt, its tokens and per-step statistics (step_seconds: the batch's steps
            the row took part in, as that row's user waits for them).
        steps: batched target forwards after the prefill.
        prefill_seconds, draft_seconds, verify_seconds, total_seconds: time split of the batch.
    """

    rows: list[GenerationResult]
    steps: int = 0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def new_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.rows)

    @property
    def step_tokens(self) -> int:
        """Tokens the steps emitted (every row's but its prefill token)."""
        return sum(r.step_tokens for r in self.rows)


@torch.inference_mode()
def generate_batch(
    runner: BatchedLMRunner,
    proposers: list[Proposer],
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_token_ids: list[int] | tuple[int, ...] = (),
    sampling: SamplingConfig | None = None,
    pad_token_id: int = 0,
) -> BatchResult:
    """Generate up to `max_new_tokens` after each prompt, all rows in one batch.

    Args:
        runner: the target's batched runner (reset here).
        proposers: one fresh proposer per prompt (chains only).
        prompts: the prompts (at least one token each).
        max_new_tokens: budget of new tokens per row; a row also stops after an EOS token.
        eos_token_ids: tokens that end a row.
        sampling: temperature / top-p / seed (each row draws from its own generator seeded like
            a single-sequence run); None or temperature 0 = greedy.
        pad_token_id: filler of shorter rows (hidden from every real token).

    Returns:
        BatchResult with each row's tokens and statistics.

    Raises:
        DraftsmithError: a proposer returned a tree (trees run at batch 1 only).
    """
    if len(proposers) != len(prompts) or not prompts:
        raise ValueError("give one proposer per prompt, and at least one prompt")
    if any(not p for p in prompts):
        raise ValueError("every prompt must hold at least one token")
    sampling = sampling or SamplingConfig()
    generators = [torch.Generator(device="cpu").manual_seed(sampling.seed) for _ in prompts]
    eos = set(eos_token_ids)
    device = runner.device
    batch = BatchResult(rows=[GenerationResult(tokens=[]) for _ in prompts])
    start = clock(device)

    roots = []
    for r, out in enumerate(runner.prefill([list(p) for p in prompts], pad_token_id)):
        proposers[r].reset(list(prompts[r]), out)
        roots.append(choose_token(out.logits[-1], sampling, generators[r]))
        batch.rows[r].tokens = emitted_tokens([roots[r]], max_new_tokens, eos)
    active = [r for r, row in enumerate(batch.rows)
              if row.tokens and row.tokens[-1] not in eos and len(row.tokens) < max_new_tokens]
    if len(active) < len(prompts) and active:
        runner.keep_rows(active)
    batch.prefill_seconds = clock(device) - start

    while active:
        active = _batch_step(runner, proposers, active, roots, batch, _Rules(
            sampling, generators, eos, max_new_tokens, pad_token_id))
    batch.total_seconds = clock(device) - start
    for row in batch.rows:
        row.prefill_seconds, row.total_seconds = batch.prefill_seconds, batch.total_seconds
    return batch


@dataclass
class _Rules:
    """What every step of one `generate_batch` call follows."""

    sampling: SamplingConfig
    generators: list[torch.Generator]
    eos: set[int]
    max_new_tokens: int
    pad_token_id: int


def _batch_step(runner: BatchedLMRunner, proposers: list[Proposer], active: list[int],
                roots: list[int], batch: BatchResult, rules: _Rules) -> list[int]:
    """One draft-and-verify step of the `active` rows: each row's chain drafted, all verified in
    one target forward, the accepted tokens emitted (`roots` and `batch` updated in place).
    Returns the rows still generating."""
    device = runner.device
    step_start = clock(device)
    trees = [proposers[r].propose(roots[r], rules.max_new_tokens - len(batch.rows[r].tokens) - 1)
             for r in active]
    if not all(tree.is_chain for tree in trees):
        raise DraftsmithError(f"{proposers[active[0]].name}: {TREES_AT_BATCH_1}")
    width = max(tree.size for tree in trees)
    tokens = torch.full((len(active), width), rules.pad_token_id, dtype=torch.long, device=device)
    for i, tree in enumerate(trees):
        tokens[i, :tree.size] = tree.tokens.to(device)
    drafted = clock(device)
    block = runner.forward_chains(tokens)
    outputs, verdicts = [], []
    for i, (r, tree) in enumerate(zip(active, trees, strict=True)):
        outputs.append(runner.row_output(block, i, tree.size))
        verdicts.append(verify(tree, outputs[-1].logits, rules.sampling, rules.generators[r]))
    runner.commit([len(path) for path, _ in verdicts])
    verified = clock(device)
    for i, r in enumerate(active):
        path, next_token = verdicts[i]
        path_tokens = trees[i].tokens[path].tolist()
        proposers[r].observe(path_tokens, outputs[i], path)
        verdicts[i] = (path, [*path_tokens[1:], next_token])
        roots[r] = next_token
    now = clock(device)

    still = []
    for i, r in enumerate(active):
        row = batch.rows[r]
        path, new = verdicts[i]
        emitted = emitted_tokens(new, rules.max_new_tokens - len(row.tokens), rules.eos)
        row.add_step(emitted, len(path) - 1, trees[i].max_depth, now - step_start)
        if emitted[-1] not in rules.eos and len(row.tokens) < rules.max_new_tokens:
            still.append(i)
    batch.steps += 1
    batch.draft_seconds += (drafted - step_start) + (now - verified)
    batch.verify_seconds += verified - drafted
    if len(still) < len(active) and still:
        runner.keep_rows(still)
    return [active[i] for i in still]
