"""Draft trees from token sequences that share prefixes: n-gram guesses (lookahead) and retrieved
continuations (REST) become one trie, each distinct prefix verified once."""

from __future__ import annotations

from collections.abc import Iterable

from draftsmith.decoding.tree import Tree, static_tree_choices, tree_from_lists


def trie_nodes(root: int, sequences: Iterable[tuple[int, ...]]) -> tuple[list[int], list[int], list[int]]:
    """Node lists of the trie of `sequences` under `root`: every distinct prefix is one node.

    Returns:
        `(tokens, parents, depths)` in topological order, node 0 the root (parent -1, depth 0).
    """
    prefixes = {seq[:d] for seq in sequences for d in range(1, len(seq) + 1)}
    ordered, parents = static_tree_choices(list(prefixes))
    return [root] + [p[-1] for p in ordered[1:]], parents, [len(p) for p in ordered]


def tree_from_nodes(tokens: list[int], parents: list[int], depths: list[int]) -> Tree:
    """A `Tree` from host node lists (topological order, node 0 the root), built on the CPU: the
    decoding loop moves its tokens to the target's device."""
    return tree_from_lists(tokens, parents, depths, "cpu")
