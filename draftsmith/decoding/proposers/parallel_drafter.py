"""Decoding with parallel feature drafters (P-EAGLE): one drafter forward per step drafts every
depth.

The drafter keeps its own KV cache of real rows, as EAGLE-3's proposer does: entry i holds
(token i+1, fused target feature of position i). A step feeds the rows verified since the last one
(the last with the root as its token) followed by k-1 mask slots at the next positions, in one
causal forward (`draft_parallel`); the last real row's and the slots' distributions are the k
depths' proposals, and only the real rows' keys and values stay. From those per-depth
distributions the step builds what the block family builds from a block's (`block_drafter.py`):
a chain (top-1, or sampled so verification rejection-samples against them) or a best-first tree
under a node budget (positions taken as independent, DDTree).
"""

from __future__ import annotations

import torch

from draftsmith.decoding.proposers.base import Proposer, TreeSettings, register_family
from draftsmith.decoding.proposers.block_drafter import BlockDrafterProposer, best_first_tree
from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.decoding.tree import Tree, root_only_tree


class ParallelDrafterProposer(BlockDrafterProposer):
    """Chains or best-first trees from a P-EAGLE drafter, all depths from one forward.

    Args:
        drafter: a PEagleDrafter (`target_feature`, `draft_parallel`, `draft_logits`, `logits`,
            `proposals`).
        tree: `chain` drafts `tree.chain_length` deep, `dynamic` `tree.dynamic.depth` deep under
            `tree.dynamic.total_tokens` nodes with its top-k (the same knobs as EAGLE-3's, so the
            two compare at the same number of drafted tokens); never deeper than the depths the
            drafter was trained for.
        name: method name in reports.
        sampling: sample the chain's drafts from the drafter's (tempered) distributions; None or
            greedy = top-1.
    """

    def __init__(self, drafter, tree: TreeSettings, name: str,
                 sampling: SamplingConfig | None = None):
        super().__init__(drafter, tree, name, sampling)
        self.past: tuple[torch.Tensor, torch.Tensor] | None = None
        self.pending_tokens: list[int] = []

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        self.past = None
        self.token_ids = self.drafter.draft_ids()
        self.pending_tokens = list(context[1:])
        self.pending = self.drafter.target_feature(
            target_out.last_hidden, target_out.hidden_states, slice(None))

    def _depth(self, max_depth: int) -> int:
        wanted = self.tree.chain_length if self.tree.shape == "chain" else self.tree.dynamic.depth
        return min(wanted, max_depth, self.drafter.proposals)

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        device = self.drafter.fc.weight.device
        depth = self._depth(max_depth)
        if depth < 1:
            self.skip(root)
            return root_only_tree(root, device)
        tokens = torch.tensor([*self.pending_tokens, root], device=device)
        if self.pending is None or self.pending.shape[0] != tokens.shape[0]:
            raise RuntimeError("parallel drafter out of step with the target (a bug)")
        seen = 0 if self.past is None else self.past[0].shape[2]
        positions = torch.arange(seen, seen + tokens.shape[0], device=device)
        hidden, (k, v) = self.drafter.draft_parallel(tokens, self.pending, positions, self.past,
                                                     depth)
        self.past = (k, v) if self.past is None else (torch.cat([self.past[0], k], 2),
                                                      torch.cat([self.past[1], v], 2))
        self.pending, self.pending_tokens = None, []
        if self.tree.shape == "chain":
            return self._chain(root, tokens[-1], hidden)
        logprobs = torch.log_softmax(self.drafter.draft_logits(hidden), -1)
        return best_first_tree(root, logprobs, self.tree.dynamic.total_tokens,
                               self.tree.dynamic.topk, self.token_ids)

    def skip(self, root: int) -> None:
        """This step's tree came from elsewhere (the lookup hybrid, or no room to draft): keep
        the root's row pending with the verified path's, fed with the next `propose`."""
        self.pending_tokens.append(root)

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        super().observe(path_tokens, target_out, path)
        self.pending_tokens = [*self.pending_tokens, *path_tokens[1:]]


@register_family("parallel")
def parallel_family(module, tree: TreeSettings, name: str) -> Proposer:
    """Parallel drafting (P-EAGLE): one drafter forward per step, chain or best-first tree."""
    return ParallelDrafterProposer(module, tree, name, tree.sampling)
