"""Tree budget auto-tuning: pick the number of draft tokens that maximises expected tokens/s here.

Two measurements on the current hardware:
  * the target's verify cost T(n) for n new tokens on a cached context (it grows slowly with n
    while the forward is bound by reading weights, then faster once compute dominates);
  * the drafter's own confidences on calibration prompts: with the largest tree, each step's nodes
    sorted by cumulative draft probability give E[tau](n) = 1 + sum of the n best path
    probabilities (EAGLE-2's assumption that draft confidence tracks acceptance).
The chosen budget maximises E[tau](n) / (T(n + 1) + T_draft).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from draftsmith.eval.decode import generate
from draftsmith.eval.proposers.base import Proposer
from draftsmith.eval.runner import CausalLMRunner
from draftsmith.eval.tree import chain_tree


def measure_verify_cost(runner: CausalLMRunner, sizes: list[int], context_len: int = 200,
                        repeats: int = 3, vocab_size: int | None = None) -> dict[int, float]:
    """Median seconds of one target forward of n new tokens (n in `sizes`) after `context_len`."""
    generator = torch.Generator().manual_seed(0)
    vocab = vocab_size or runner.lm_head.weight.shape[0]
    runner.reset()
    runner.forward(torch.randint(0, vocab, (context_len,), generator=generator), logits_to_keep=1)
    runner.commit()
    costs = {}
    for n in sizes:
        tree = chain_tree(0, torch.randint(0, vocab, (n - 1,), generator=generator).tolist())
        mask = torch.ones(n, n, dtype=torch.bool).tril()  # a full mask: same cost as any tree mask
        times = []
        for _ in range(repeats + 1):  # the first call warms the shape up
            start = time.perf_counter()
            runner.forward(tree.tokens, runner.length + tree.depths, mask if n > 1 else None)
            if runner.device.type == "cuda":
                torch.cuda.synchronize(runner.device)
            times.append(time.perf_counter() - start)
            runner.rollback()
        costs[n] = statistics.median(times[1:])
    return costs


class _ScoreRecorder:
    """Wraps a proposer and keeps each step's node path probabilities, best first."""

    def __init__(self, inner: Proposer):
        self.inner = inner
        self.name = inner.name
        self.steps: list[list[float]] = []

    def reset(self, context, target_out):
        self.inner.reset(context, target_out)

    def propose(self, root, max_depth):
        tree = self.inner.propose(root, max_depth)
        if tree.scores is not None:
            self.steps.append(sorted(tree.scores[1:].exp().tolist(), reverse=True))
        return tree

    def observe(self, path_tokens, target_out, path):
        self.inner.observe(path_tokens, target_out, path)


@dataclass
class TreeBudget:
    """The autotuner's choice and the curves behind it (seconds, expected tau per size)."""

    total_tokens: int
    verify_seconds: dict[int, float]
    expected_tau: dict[int, float]
    draft_seconds_per_step: float
    expected_tokens_per_second: dict[int, float]


def autotune_total_tokens(
    runner: CausalLMRunner,
    make_proposer: Callable[[int], Proposer],
    prompts: list[list[int]],
    sizes: tuple[int, ...] = (2, 4, 8, 12, 16, 24, 32, 48, 64),
    max_new_tokens: int = 32,
) -> TreeBudget:
    """Choose the dynamic tree's `total_tokens` for this target, drafter and machine.

    Args:
        runner: the target's runner.
        make_proposer: builds a tree proposer with the given total_tokens (it must set
            `Tree.scores`, as the dynamic tree does).
        prompts: calibration prompts (token ids).
        sizes: candidate budgets (draft tokens, root excluded).
        max_new_tokens: tokens generated per calibration prompt.
    """
    verify = measure_verify_cost(runner, [1, *[n + 1 for n in sizes]])
    recorder = _ScoreRecorder(make_proposer(max(sizes)))
    draft_seconds, steps = 0.0, 0
    for prompt in prompts:
        result = generate(runner, recorder, prompt, max_new_tokens)
        draft_seconds += result.draft_seconds
        steps += result.steps
    if not recorder.steps:
        raise ValueError("the proposer reported no node scores; autotuning needs a dynamic tree")
    t_draft = draft_seconds / max(steps, 1)
    tau = {n: 1 + statistics.fmean(sum(s[:n]) for s in recorder.steps) for n in sizes}
    speed = {n: tau[n] / (verify[n + 1] + t_draft) for n in sizes}
    best = max(sizes, key=lambda n: speed[n])
    return TreeBudget(best, verify, tau, t_draft, speed)
