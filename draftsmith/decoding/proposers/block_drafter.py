"""Decoding with block drafters (DFlash, DSpark): one drafter forward per step proposes a block.

The drafter keeps, per layer, the keys and values of the fused target features of every verified
position (the context); a step feeds the features of the tokens verified since the last one, then
runs the block `[root, MASK ...]` at the root's position. The block's per-position distributions
become a chain (top-1, or sampled from them when sampling, so verification rejection-samples
against them) or a tree grown best-first under a node budget (DDTree: positions are independent,
so a path's score is the sum of its ranks' log-probabilities; DSpark's Markov head conditions
each position on its parent's token, so its tree grows by EAGLE-2's expansion instead).
"""

from __future__ import annotations

import heapq

import torch

from draftsmith.decoding.proposers.base import Proposer, TreeSettings, register_family
from draftsmith.decoding.proposers.tree_expansion import grow_dynamic_tree
from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.sampling import SamplingConfig, logits_to_probs, sample_token
from draftsmith.decoding.tree import Tree, chain_tree, root_only_tree, tree_from_lists
from draftsmith.models.block_layers import ContextCache


def best_first_tree(root: int, logprobs: torch.Tensor, budget: int, topk: int,
                    token_ids: torch.Tensor | None = None) -> Tree:
    """DDTree: the `budget` most probable nodes of the tree whose depth-d children are the top-k
    tokens of position d, scoring a path by the sum of its log-probabilities (positions
    independent). A heap pops the best node and pushes its next sibling and its first child, so
    every node's parent is popped first (topological order). One host read.

    Args:
        root: the root token.
        logprobs: (D, V) per-position log-probabilities of the block's proposals.
        budget: draft nodes (root excluded).
        topk: children kept per position.
        token_ids: the token id of each of `logprobs`' columns (a draft vocabulary's target ids);
            None = the column is the id.
    """
    depth_count = logprobs.shape[0]
    top = logprobs.float().topk(min(topk, logprobs.shape[1]), dim=-1)
    chosen = top.indices if token_ids is None else token_ids[top.indices]
    values, indices = top.values.tolist(), chosen.tolist()  # one host read
    tokens, parents, depths, scores = [root], [-1], [0], [0.0]
    heap = [(-values[0][0], 0, 0, 0)]  # (-score, depth, rank, parent node)
    while heap and len(tokens) <= budget:
        negative, depth, rank, parent = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(indices[depth][rank])
        parents.append(parent)
        depths.append(depth + 1)
        scores.append(-negative)
        if rank + 1 < len(values[depth]):
            heapq.heappush(heap, (negative - values[depth][rank + 1] + values[depth][rank],
                                  depth, rank + 1, parent))
        if depth + 1 < depth_count:
            heapq.heappush(heap, (negative - values[depth + 1][0], depth + 1, 0, node))
    tree = tree_from_lists(tokens, parents, depths, logprobs.device)
    tree.scores = torch.tensor(scores, device=logprobs.device)
    return tree


class BlockDrafterProposer:
    """Chains or trees from a DFlash or DSpark drafter.

    Args:
        drafter: a DFlashDrafter / DSparkDrafter (`context_kv`, `draft_block`, `logits`).
        tree: the tree shape (`chain`: the block's top-1 or sampled drafts; `dynamic`: best-first
            under `tree.dynamic.total_tokens` with its top-k), each `tree.block_length` deep at
            most (None: the whole block).
        name: method name in reports.
        sampling: sample the chain's drafts from the drafter's (tempered) distributions; None or
            greedy = top-1.
    """

    needs_hidden_states = True
    record_scores = False  # chains carry their path log-probabilities (the autotuner asks)

    def __init__(self, drafter, tree: TreeSettings, name: str,
                 sampling: SamplingConfig | None = None):
        self.drafter = drafter
        self.tree = tree
        self.name = name
        self.sampling = sampling if sampling is not None and not sampling.greedy else None
        self.generator = torch.Generator().manual_seed(sampling.seed + 2) if self.sampling else None
        self.markov = hasattr(drafter, "row_logits")
        self.context: ContextCache | None = None
        self.pending: torch.Tensor | None = None
        self.token_ids: torch.Tensor | None = None

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        self.context = None
        self.token_ids = self.drafter.draft_ids()  # target id of each head column, once per prompt
        self.pending = self.drafter.target_feature(
            target_out.last_hidden, target_out.hidden_states, slice(None))

    def _feed(self) -> None:
        """Append the pending features' keys and values to every layer's context."""
        if self.pending is None:
            return
        if self.context is None:
            self.context = ContextCache(self.drafter.block_size)
        start = self.context.length
        positions = torch.arange(start, start + self.pending.shape[0], device=self.pending.device)
        self.context.append(self.drafter.context_kv(self.pending, positions))
        self.pending = None

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        device = self.drafter.fc.weight.device
        self._feed()
        if max_depth < 1:
            return root_only_tree(root, device)
        anchor = torch.tensor(root, device=device)
        hidden = self.drafter.draft_block(anchor, self.context)  # (P, H)
        depth = min(hidden.shape[0], max_depth, self.tree.block_length or hidden.shape[0])
        if self.tree.shape == "chain":
            return self._chain(root, anchor, hidden[:depth])
        if self.markov:
            return self._markov_tree(root, hidden[:depth])
        # over the head's own columns: a draft vocabulary's Vd, not the target's V
        logprobs = torch.log_softmax(self.drafter.draft_logits(hidden[:depth]), -1)
        return best_first_tree(root, logprobs, self.tree.dynamic.total_tokens,
                               self.tree.dynamic.topk, self.token_ids)

    def _chain(self, root: int, anchor: torch.Tensor, hidden: torch.Tensor) -> Tree:
        if not self.markov:
            if self.sampling is None:  # top-1 over the head's own columns (Vd with a draft vocab)
                logits = self.drafter.draft_logits(hidden)
                columns = logits.argmax(-1)
                drafts = columns if self.token_ids is None else self.token_ids[columns]
                return self._scored(chain_tree(root, drafts.tolist(), device=logits.device),
                                    logits, columns)
            logits = self.drafter.logits(hidden)  # (D, V): rejection sampling reads all of V
            probs = logits_to_probs(logits, self.sampling)
            drafts = torch.cat([sample_token(row, self.generator) for row in probs])
            return self._scored(chain_tree(root, drafts.tolist(), probs), logits, drafts)
        # DSpark: left to right, each row conditioned on the token before it
        base = self.drafter.logits(hidden)  # every row's head in one product
        previous, drafts, rows, confident, row_logits = anchor, [], [], [], []
        for k in range(hidden.shape[0]):
            logits, confidence = self.drafter.row_logits(hidden[k], previous, base[k])
            row_logits.append(logits)
            if self.sampling is None:
                previous = logits.argmax(-1)
            else:
                rows.append(logits_to_probs(logits, self.sampling))
                previous = sample_token(rows[-1], self.generator)[0]
            drafts.append(previous)
            confident.append(confidence)
        drafts = torch.stack(drafts)
        keep = drafts.shape[0]
        threshold = self.drafter.config.confidence_threshold
        if threshold > 0:  # cut at the first proposal the head doubts (one host read)
            doubted = (torch.sigmoid(torch.stack(confident)) < threshold).int()
            keep = int(doubted.argmax()) if bool(doubted.any()) else keep
        probs = torch.stack(rows)[:keep] if rows else None
        if keep == 0:
            return root_only_tree(root, drafts.device)
        return self._scored(chain_tree(root, drafts[:keep].tolist(), probs, device=drafts.device),
                            torch.stack(row_logits[:keep]), drafts[:keep])

    def _scored(self, tree: Tree, logits: torch.Tensor, columns: torch.Tensor) -> Tree:
        """The chain with its nodes' path log-probabilities under the drafter (root 0) when
        `record_scores` is set: what the autotuner prices block lengths by. `columns`: each
        draft's column in `logits`."""
        if self.record_scores:
            chosen = torch.log_softmax(logits.float(), -1).gather(1, columns.view(-1, 1))[:, 0]
            tree.scores = torch.cat([chosen.new_zeros(1), chosen.cumsum(0)])
        return tree

    def _markov_tree(self, root: int, hidden: torch.Tensor) -> Tree:
        """DSpark's tree: EAGLE-2 expansion where a node's children come from the next row's
        logits plus the Markov bias of the node's token (no drafter forward per level)."""
        depth_of = {-1: 0}
        base = self.drafter.logits(hidden)  # every row's head once; nodes add their Markov bias

        def expand(tokens: torch.Tensor, ids: list[int], parents: list[int]) -> torch.Tensor:
            rows = []
            for node, parent in zip(ids, parents, strict=True):
                depth_of[node] = depth_of[parent] + 1
                rows.append(depth_of[node])
            logits, _ = self.drafter.row_logits(hidden[rows], tokens, base[rows])
            return torch.log_softmax(logits, -1)

        first, _ = self.drafter.row_logits(hidden[0], torch.tensor(root, device=hidden.device),
                                           base[0])
        return grow_dynamic_tree(root, torch.log_softmax(first, -1), expand, self.tree.dynamic,
                                 hidden.shape[0])

    def skip(self, root: int) -> None:
        """Another proposer drafts this step: nothing to keep, since the context holds features
        only and `observe` hands over the verified path's, root first."""

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        index = torch.tensor(path, device=target_out.last_hidden.device)
        features = self.drafter.target_feature(target_out.last_hidden,
                                               target_out.hidden_states, index)
        self.pending = features if self.pending is None else torch.cat([self.pending, features])


@register_family("block")
def block_family(module, tree: TreeSettings, name: str) -> Proposer:
    """Block drafting (DFlash, DSpark): one drafter forward per step, chain or best-first tree."""
    return BlockDrafterProposer(module, tree, name, tree.sampling)
