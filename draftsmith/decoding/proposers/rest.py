"""REST (He et al. 2024): draft trees retrieved from a datastore, no draft model and no training.

Each step looks up the longest suffix of the context (prompt and text so far) in the datastore's
suffix array, suffix lengths tried from long to short, takes the continuations of its matches and
keeps the `num_tokens` most frequent prefixes of them as the draft tree (a trie: a prefix is
always at least as frequent as its extensions, so the selection is connected). As in REST, the
candidates are verified as a tree by the loop's lossless verifier. Unlike REST's retriever, which
takes the first matches in suffix-array order, matches beyond `max_matches` are sampled evenly
over the range, so the counts estimate the continuations' frequencies.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from draftsmith.decoding.proposers.token_trie import tree_from_nodes, trie_nodes
from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.tree import Tree


class RetrievalIndex(Protocol):
    """What REST retrieves from (`draftsmith.data.datastore.Datastore` is one)."""

    def lookup(self, context: list[int], depth: int, max_suffix: int, min_suffix: int,
               max_matches: int) -> tuple[np.ndarray, int]:
        """Continuations (m, depth) of the longest matching suffix of `context` (-1 after a
        row's end), and the suffix length matched."""
        ...


def frequent_prefixes(continuations: np.ndarray, budget: int) -> list[tuple[int, ...]]:
    """The `budget` most frequent prefixes of the rows (ties: shorter, then first in sort order).

    Args:
        continuations: (m, depth) token rows, -1 after a row's end.
        budget: prefixes to keep.

    Returns:
        Prefix tuples, most frequent first; every kept prefix's own prefixes are kept too.
    """
    m, depth = continuations.shape
    if not m or budget < 1:
        return []
    rows = continuations[np.lexsort(continuations.T[::-1])]  # sorted by column 0, then 1, ...
    boundary = np.zeros(m, dtype=bool)
    counts, depths, firsts = [], [], []
    for d in range(depth):
        column = rows[:, d]
        boundary[1:] |= column[1:] != column[:-1]
        boundary[0] = True
        starts = np.flatnonzero(boundary)
        valid = column[starts] >= 0
        counts.append(np.diff(np.append(starts, m))[valid])
        firsts.append(starts[valid])
        depths.append(np.full(int(valid.sum()), d + 1))
    counts, depths, firsts = map(np.concatenate, (counts, depths, firsts))
    chosen = np.lexsort((firsts, depths, -counts))[:budget]
    return [tuple(rows[firsts[i], :depths[i]].tolist()) for i in chosen]


class RestProposer:
    """Tree proposer from datastore retrieval.

    Args:
        datastore: the loaded datastore (see `draftsmith.data.datastore`).
        num_tokens: draft nodes per tree (root excluded).
        depth: longest continuation drafted.
        max_suffix, min_suffix: suffix lengths tried, from long to short.
        max_matches: matches counted per lookup.
    """

    name = "rest"
    needs_hidden_states = False

    def __init__(self, datastore: RetrievalIndex, num_tokens: int = 16, depth: int = 10,
                 max_suffix: int = 16, min_suffix: int = 2, max_matches: int = 1000):
        if not 1 <= min_suffix <= max_suffix:
            raise ValueError(f"need 1 <= min_suffix ({min_suffix}) <= max_suffix ({max_suffix})")
        self.datastore, self.num_tokens, self.depth = datastore, num_tokens, depth
        self.max_suffix, self.min_suffix, self.max_matches = max_suffix, min_suffix, max_matches
        self.tokens: list[int] = []

    def reset(self, context: list[int], target_out: ForwardOutput | None = None) -> None:
        self.tokens = list(context)

    def propose(self, root: int, max_depth: int) -> Tree:
        self.tokens.append(root)
        depth = min(self.depth, max_depth)
        prefixes = []
        if depth > 0:
            continuations, _ = self.datastore.lookup(
                self.tokens[-self.max_suffix:], depth, self.max_suffix, self.min_suffix,
                self.max_matches)
            prefixes = frequent_prefixes(continuations, self.num_tokens)
        return tree_from_nodes(*trie_nodes(root, prefixes))

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        self.tokens.extend(path_tokens[1:])
