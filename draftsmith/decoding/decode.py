"""The speculative decoding loop: propose a tree, verify it in one target forward, keep what matches.

With greedy verification the output is token for token the target's own greedy output; with
sampling it follows the target's distribution exactly (see `verify.py`). Plain decoding is the
same loop with `NoDraftProposer`, so speedups compare like with like.

The prefill forwards the whole prompt and its logits at the last prompt token choose the first
new token, for every method alike (as plain decoding anywhere does): no method verifies the last
prompt token together with drafts, whose multi-token forward may round a low-precision (bf16)
logit otherwise and part from plain decoding at the very first token. The steps follow, each from
the last chosen token (the root), so a step's tokens are its accepted drafts and its bonus token,
and the first token, the prefill's, belongs to no step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from draftsmith.decoding.proposers.base import Proposer
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.decoding.sampling import SamplingConfig, choose_token
from draftsmith.decoding.tree import Tree, ancestor_mask
from draftsmith.decoding.verify import verify


@dataclass
class GenerationResult:
    """One prompt's output and where its time went.

    Attributes:
        tokens: the new tokens (EOS included when reached): the prefill's first token, then every
            step's.
        accepted_per_step: draft tokens accepted at each target step (bonus excluded).
        depth_per_step: depth of the tree proposed at each step.
        tokens_per_step: tokens emitted at each step (after EOS / budget truncation); they sum to
            all tokens but the prefill's first.
        step_seconds: wall time of each step.
        prefill_seconds, draft_seconds, verify_seconds, total_seconds: time split; bookkeeping is
            total - prefill - draft - verify. The prefill includes choosing the first token (the
            time to first token).
    """

    tokens: list[int]
    accepted_per_step: list[int] = field(default_factory=list)
    depth_per_step: list[int] = field(default_factory=list)
    tokens_per_step: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.tokens_per_step)

    @property
    def step_tokens(self) -> int:
        """Tokens the steps emitted: all but the prefill's first token."""
        return sum(self.tokens_per_step)

    @property
    def tau(self) -> float:
        """Mean tokens per target step after the prefill, bonus included (plain decoding = 1.0)."""
        return self.step_tokens / max(self.steps, 1)

    @property
    def decode_seconds(self) -> float:
        return self.total_seconds - self.prefill_seconds

    def add_step(self, emitted: list[int], accepted: int, depth: int, seconds: float) -> None:
        """Record one target step: the tokens it emitted and its accepted and drafted depth."""
        self.tokens.extend(emitted)
        self.accepted_per_step.append(accepted)
        self.depth_per_step.append(depth)
        self.tokens_per_step.append(len(emitted))
        self.step_seconds.append(seconds)


def emitted_tokens(new: list[int], room: int, eos: set[int]) -> list[int]:
    """What a step emits of its `new` tokens: at most `room`, and nothing after an EOS token."""
    emitted = []
    for token in new[:room]:
        emitted.append(token)
        if token in eos:
            break
    return emitted


def clock(device: torch.device) -> float:
    """Wall time in seconds, after the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.inference_mode()
def generate(
    runner: CausalLMRunner,
    proposer: Proposer,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_token_ids: list[int] | tuple[int, ...] = (),
    sampling: SamplingConfig | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` after `prompt_ids` with speculative decoding.

    Args:
        runner: the target with its cache (reset here).
        proposer: where drafts come from.
        prompt_ids: the prompt (at least one token).
        max_new_tokens: budget of new tokens; generation also stops after an EOS token.
        eos_token_ids: tokens that end generation.
        sampling: temperature / top-p / seed; None or temperature 0 = greedy.

    Returns:
        GenerationResult with the tokens and per-step statistics.
    """
    if not prompt_ids:
        raise ValueError("the prompt must hold at least one token")
    sampling = sampling or SamplingConfig()
    generator = torch.Generator(device="cpu").manual_seed(sampling.seed)
    eos = set(eos_token_ids)
    device = runner.device
    result = GenerationResult(tokens=[])
    start = clock(device)

    runner.reset()
    prefill = runner.forward(torch.tensor(prompt_ids, device=device), logits_to_keep=1)
    runner.commit()
    proposer.reset(list(prompt_ids), prefill)
    root = choose_token(prefill.logits[-1], sampling, generator)
    result.tokens = emitted_tokens([root], max_new_tokens, eos)
    now = clock(device)
    result.prefill_seconds = now - start

    while result.tokens and result.tokens[-1] not in eos and len(result.tokens) < max_new_tokens:
        step_start = now
        tree = proposer.propose(root, max_depth=max_new_tokens - len(result.tokens) - 1)
        tree.tokens = tree.tokens.to(device)
        drafted = clock(device)
        out = runner.forward(
            tree.tokens,
            position_ids=runner.length + tree.depths.to(device),
            tree_mask=None if tree.is_chain else _tree_mask(tree, device),
        )
        verified = clock(device)
        path, next_token = verify(tree, out.logits, sampling, generator)
        runner.commit(path)
        path_tokens = tree.tokens[path].tolist()
        new = [*path_tokens[1:], next_token]
        proposer_start = clock(device)
        proposer.observe(path_tokens, out, path)
        now = clock(device)

        emitted = emitted_tokens(new, max_new_tokens - len(result.tokens), eos)
        result.add_step(emitted, len(path) - 1, tree.max_depth, now - step_start)
        result.draft_seconds += (drafted - step_start) + (now - proposer_start)
        result.verify_seconds += verified - drafted
        root = next_token
    result.total_seconds = clock(device) - start
    return result


def _tree_mask(tree: Tree, device: torch.device) -> torch.Tensor:
    return ancestor_mask(tree.parents, tree.depths).to(device)
