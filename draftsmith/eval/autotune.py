"""Tree budget auto-tuning: pick the tree depth and number of draft tokens that maximise expected
tokens/s on this machine, for this target and this drafter.

Two measurements on the current hardware:
  * the target's verify cost T(n) for n new tokens on a cached context (it grows slowly with n
    while the forward is bound by reading weights, then faster once compute dominates);
  * the calibration prompts decoded with the deepest, largest tree: each step's nodes sorted by
    cumulative draft probability, and the drafting time per depth. The tree of depth d and n
    tokens holds the n best nodes at depth <= d (EAGLE-2's reranking), so in greedy decoding the
    tokens it would have accepted are the accepted path's nodes it holds, up to the first it lacks
    (the target's choice at each node does not depend on the other nodes): E[tau](d, n) = 1 +
    their mean over the steps. Sampled acceptance is random, so there E[tau](d, n) = 1 + the mean
    sum of the n best path probabilities (EAGLE-2's assumption that draft confidence tracks
    acceptance; on SmolLM2 at temperature 0 it fell 0.15-0.3 below the tau decoded).
The chosen (d, n) maximises E[tau](d, n) / (T(n + 1) + d * T_depth). On a CPU, where a drafter
forward is a sizeable share of a small target's forward, this picks shallow, narrow trees for a
weak drafter and deeper ones as it improves.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import Proposer
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.decoding.tree import chain_tree


def measure_verify_cost(runner: CausalLMRunner, sizes: list[int], context_len: int = 200,
                        repeats: int = 3, vocab_size: int | None = None,
                        reduce: Callable[[list[float]], float] = statistics.median
                        ) -> dict[int, float]:
    """Seconds of one target forward of n new tokens (n in `sizes`) after `context_len`: `reduce`
    (median by default; min resists a busy machine) over `repeats` timings after a warm-up."""
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
        costs[n] = reduce(times[1:])
    return costs


CALIBRATION_TREE = 128  # the most draft nodes the calibration's tree holds (prompts_fit.py)


class _ScoreRecorder:
    """Wraps a proposer and keeps each drafted step's nodes, best first by path probability (as
    (probability, depth, node index)), and the nodes the target accepted."""

    def __init__(self, inner: Proposer):
        self.inner = inner
        # a chain that scores its nodes only when asked, alone or as a hybrid's drafter
        for proposer in (inner, getattr(inner, "drafter", None)):
            if hasattr(proposer, "record_scores"):
                proposer.record_scores = True
        self.name = inner.name
        self.steps: list[list[tuple[float, int, int]]] = []
        self.accepted: list[list[int]] = []
        self._scored = False

    def reset(self, context, target_out):
        self.inner.reset(context, target_out)

    def propose(self, root, max_depth):
        tree = self.inner.propose(root, max_depth)
        self._scored = tree.scores is not None  # a hybrid's prompt-lookup step has no scores
        if self._scored:  # best first; a tie keeps the earlier (shallower) node, as the tree does
            self.steps.append(sorted(zip(tree.scores[1:].exp().tolist(),
                                         tree.depths[1:].tolist(),
                                         range(1, len(tree.tokens)), strict=True),
                                     key=lambda node: (-node[0], node[2])))
        return tree

    def observe(self, path_tokens, target_out, path):
        if self._scored:
            self.accepted.append(list(path[1:]))
        self.inner.observe(path_tokens, target_out, path)

    def expected_tau(self, depth: int, size: int, greedy: bool) -> float:
        """E[tau] of the tree holding each step's `size` best nodes at depth <= `depth`."""
        def kept(nodes):
            return [node for node in nodes if node[1] <= depth][:size]

        if not greedy:
            return 1 + statistics.fmean(sum(p for p, _, _ in kept(nodes)) for nodes in self.steps)

        def accepted(nodes, path):
            held = {index for _, _, index in kept(nodes)}
            return next((i for i, node in enumerate(path) if node not in held), len(path))

        return 1 + statistics.fmean(accepted(nodes, path)
                                    for nodes, path in zip(self.steps, self.accepted, strict=True))


@dataclass
class TreeBudget:
    """The autotuner's choice and the curves behind it (seconds; expected tau and tokens/s per
    "depth,size" key)."""

    total_tokens: int
    depth: int
    verify_seconds: dict[int, float]
    expected_tau: dict[str, float]
    draft_seconds_per_depth: float
    expected_tokens_per_second: dict[str, float]
    draft_seconds_per_step: float = 0.0
    calibration_prompts: list[str] = field(default_factory=list)  # "set/item", as the eval names


def autotune_tree(
    runner: CausalLMRunner,
    make_proposer: Callable[[int, int], Proposer],
    prompts: list[list[int]],
    sizes: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64),
    depths: tuple[int, ...] = (1, 2, 3, 4, 5, 6),
    max_new_tokens: int = 32,
    topk: int | None = None,
    sampling: SamplingConfig | None = None,
    repeats: int = 5,
    draft_per_step: bool = False,
    chain: bool = False,
) -> TreeBudget:
    """Choose the dynamic tree's depth and `total_tokens` for this target, drafter and machine.

    Args:
        runner: the target's runner.
        make_proposer: builds a tree proposer for (depth, total_tokens) (it must set
            `Tree.scores`, as the dynamic tree does).
        prompts: calibration prompts (token ids).
        sizes: candidate budgets (draft tokens, root excluded); `topk` is added.
        depths: candidate depths.
        max_new_tokens: tokens generated per calibration prompt.
        topk: the tree's top-k: a tree of depth d holds at most k + (d - 1) * k^2 candidates,
            so a larger budget is priced at that size.
        sampling: the evaluation's sampling settings (calibrate at its temperature).
        repeats: verify-cost timings per size (minimum taken, after the calibration warmed up).
        draft_per_step: drafting costs the same at every depth (a block drafter's one forward);
            otherwise one drafter forward per depth.
        chain: the proposer drafts chains (a block drafter's), so only size = depth is a
            candidate: the chain's length.
    """
    if chain:
        sizes, topk = tuple(depths), None
    if topk:
        sizes = tuple(sorted({*sizes, topk}))
    deepest = max(depths)
    # the deepest tree whole (up to CALIBRATION_TREE nodes), so that every smaller tree's n best
    # nodes at depth <= d are among those drafted (past the cap a shallow tree's estimate counts
    # only the nodes the cap held: a lower bound)
    calibration = max(sizes) if chain else \
        max(max(sizes), min(tree_capacity(deepest, topk), CALIBRATION_TREE))
    recorder = _ScoreRecorder(make_proposer(deepest, calibration))
    draft_seconds = 0.0
    for prompt in prompts:  # also warms the target's shapes up before its costs are timed
        result = generate(runner, recorder, prompt, max_new_tokens, sampling=sampling)
        draft_seconds += result.draft_seconds
    priced = {d: {n: min(n, tree_capacity(d, topk)) for n in sizes if not chain or n == d}
              for d in depths}
    verify = measure_verify_cost(runner, sorted({1, *[m + 1 for row in priced.values()
                                                        for m in row.values()]}),
                                 repeats=repeats, reduce=min)
    if not recorder.steps:
        raise ValueError("the proposer reported no node scores: autotuning needs a dynamic tree "
                         "drafted on the calibration prompts (a hybrid that drafted every step by "
                         "prompt lookup has none; pass --tree-total-tokens N instead of auto)")
    # per drafted step: a hybrid's prompt-lookup steps record no scores and cost no drafting
    t_step = draft_seconds / max(len(recorder.steps), 1)
    t_depth = t_step / deepest
    tau, speed = {}, {}
    greedy = sampling is None or sampling.greedy
    for d in depths:
        for n in priced[d]:
            key = f"{d},{n}"
            tau[key] = recorder.expected_tau(d, priced[d][n], greedy)
            drafting = t_step if draft_per_step else d * t_depth
            speed[key] = tau[key] / (verify[priced[d][n] + 1] + drafting)
    best = max(speed, key=speed.get)
    d, n = (int(x) for x in best.split(","))
    return TreeBudget(priced[d][n], d, verify, tau, t_depth, speed, t_step)


def tree_capacity(depth: int, topk: int | None) -> int:
    """Most draft nodes an EAGLE-2 tree of `depth` rounds and top-k can hold (k + (d-1) k^2);
    unbounded when top-k is not known."""
    if not topk:
        return 10**9
    return topk + (depth - 1) * topk * topk
