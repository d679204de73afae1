"""The interface every proposer implements, and the no-draft proposer of plain decoding."""

from __future__ import annotations

from typing import Protocol

from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.tree import Tree, root_only_tree


class Proposer(Protocol):
    """Builds a draft tree each step and follows what the target accepted.

    The decoding loop calls `reset` once per prompt with the committed context (every prompt
    token but the last) and the target's prefill output, then per step `propose(root, ...)`, where
    root is the last chosen token (not yet verified by a forward), and `observe` with the accepted
    path's tokens (root first) and the target's outputs for those nodes.
    """

    name: str

    def reset(self, context: list[int], target_out: ForwardOutput) -> None: ...

    def propose(self, root: int, max_depth: int) -> Tree: ...

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None: ...


class NoDraftProposer:
    """Plain decoding: the tree is the root alone, so every step verifies one token."""

    name = "plain"

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        pass

    def propose(self, root: int, max_depth: int) -> Tree:
        return root_only_tree(root, "cpu")  # host-built; the loop moves it to the target

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        pass
