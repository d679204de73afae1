"""Decoding with feature drafters (EAGLE-1, EAGLE-2 = EAGLE-1 with a dynamic tree, EAGLE-3).

The drafter has its own one-layer KV cache. Entry i holds (token i+1, feature of position i), where
the feature comes from the target's verify forward (EAGLE-1: last hidden state; EAGLE-3: fused
layer outputs). Accepted nodes' features are fed with the next root; tree nodes use their parent's
drafted feature, sit at position (last fed entry + depth) and are dropped once the tree is built.
"""

from __future__ import annotations

import torch

from draftsmith.decoding.proposers.base import Proposer, TreeSettings, register_family
from draftsmith.decoding.proposers.tree_expansion import (
    DEFAULT_CHOICES,
    DynamicTreeConfig,
    TreeSlots,
    chain_choices,
    grow_dynamic_tree,
    grow_static_tree,
)
from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.tree import Tree
from draftsmith.models.contracts import FeatureDrafterModule


class FeatureDrafterProposer:
    """Static, chain or dynamic trees from an EAGLE-1 or EAGLE-3 drafter.

    Args:
        drafter: module with `target_feature` and `draft` (Eagle1Drafter, Eagle3Drafter).
        choices: static tree (rank paths); used when `dynamic` is None.
        dynamic: EAGLE-2 expansion settings.
        name: method name in reports.
    """

    needs_hidden_states = True

    def __init__(self, drafter: FeatureDrafterModule, choices: tuple[tuple[int, ...], ...] | None = None,
                 dynamic: DynamicTreeConfig | None = None, name: str = "drafter"):
        if choices is None and dynamic is None:
            raise ValueError("give static choices or a dynamic tree config")
        self.drafter = drafter
        self.choices = choices
        self.dynamic = dynamic
        self.name = name
        self.keys = self.values = None
        self.length = 0
        self.pending_features: torch.Tensor | None = None
        self.pending_tokens: list[int] = []

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        self.keys = self.values = None
        self.length = 0
        self.pending_tokens = list(context[1:])
        self.pending_features = self.drafter.target_feature(
            target_out.last_hidden, target_out.hidden_states, slice(None))

    def _mask(self, rows: int, visible_tree: torch.Tensor) -> torch.Tensor:
        """(1, 1, rows, committed + tree) bool: committed entries visible, tree part given."""
        committed = torch.ones(rows, self.length, dtype=torch.bool, device=self.device)
        return torch.cat([committed, visible_tree], dim=1)[None, None]

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        device = self.device = next(self.drafter.parameters()).device
        tokens = torch.tensor([*self.pending_tokens, root], device=device)
        n = tokens.shape[0]
        if self.pending_features is None or self.pending_features.shape[0] != n:
            raise RuntimeError("feature drafter out of step with the target (a bug)")
        positions = torch.arange(self.length, self.length + n, device=device)
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        past = None if self.keys is None else (self.keys, self.values)
        hidden, logp, (k, v) = self.drafter.draft(tokens, self.pending_features, positions,
                                                   self._mask(n, causal), past, last_only=True)
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=2)
        self.length += n
        self.pending_tokens, self.pending_features = [], None

        self._features = {-1: hidden[-1]}
        self._slots = TreeSlots(device)
        self._tree_k, self._tree_v = [], []
        if self.dynamic is not None:
            return grow_dynamic_tree(root, logp[-1], self._expand, self.dynamic, max_depth)
        return grow_static_tree(root, logp[-1], self._expand, self.choices, max_depth)

    def _expand(self, tokens: torch.Tensor, ids: list[int], parents: list[int]) -> torch.Tensor:
        visible, depths = self._slots.add(ids, parents)
        positions = torch.tensor([self.length - 1 + d for d in depths], device=self.device)
        features = torch.stack([self._features[p] for p in parents])
        keys = torch.cat([self.keys, *self._tree_k], dim=2)
        values = torch.cat([self.values, *self._tree_v], dim=2)
        hidden, logp, (k, v) = self.drafter.draft(
            tokens.to(self.device), features, positions, self._mask(len(ids), visible),
            (keys, values))
        self._tree_k.append(k)
        self._tree_v.append(v)
        for row, node in enumerate(ids):
            self._features[node] = hidden[row]
        return logp

    def skip(self, root: int) -> None:
        """This step's tree came from elsewhere (a hybrid's prompt lookup): keep the root's entry
        pending with the verified path's, so the next `propose` feeds them all at once."""
        self.pending_tokens.append(root)

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        index = torch.tensor(path, device=target_out.last_hidden.device)
        features = self.drafter.target_feature(
            target_out.last_hidden, target_out.hidden_states, index)
        if self.pending_features is not None:  # a skipped step's entries are still pending
            features = torch.cat([self.pending_features, features])
        self.pending_features = features
        self.pending_tokens = [*self.pending_tokens, *path_tokens[1:]]


@register_family("feature")
def feature_family(module: FeatureDrafterModule, tree: TreeSettings, name: str) -> Proposer:
    """Autoregressive drafting on the target's features (EAGLE-1/2, EAGLE-3), any tree shape."""
    if tree.shape == "dynamic":
        return FeatureDrafterProposer(module, dynamic=tree.dynamic, name=name)
    choices = chain_choices(tree.chain_length) if tree.shape == "chain" else DEFAULT_CHOICES
    return FeatureDrafterProposer(module, choices, name=name)
