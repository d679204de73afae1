"""Lookahead decoding (Fu et al. 2024): a Jacobi lookahead window and an n-gram pool, no draft model.

Each step's tree holds both of the paper's branches, so the target computes them in the same
forward as verification:

  * verification branch: the pool's n-grams that start with the root (at most G, each N-1 tokens
    after it), merged into a trie;
  * lookahead branch: a window of W columns and N-1 levels of Jacobi guesses. Level 0 is the chain
    root, K1, ..., K(W-1) (position i = root + i); level l >= 1 holds one token per column i at
    position root + i + l, whose parent is the column's level l-1 token. A level-l token thus
    attends to exactly the tokens of positions before it (level 0 up to its column, then its
    column's levels 1..l-1): the paper's lookahead attention mask, as a tree.

After the forward, the target's argmax at each column's top token is that column's next Jacobi
guess. With all N-1 levels filled, each column yields an N-gram (level 0 token, levels 1..N-2,
the new guess) for the pool (keyed by its first token, at most G per key, least recently seen
dropped first), the oldest level is dropped and the new guesses become the top level. The first
N-2 steps only fill levels (warm-up); level 0 starts as tokens drawn at random from the prompt.
These follow the reference implementation (LADE) with its default of moving the window one
position per step whatever was accepted.

How this differs from the paper: the verifier sees one tree, so a lookahead-branch path that
matches the target's own choices is accepted as well (Jacobi decoding's acceptance; lossless, as
every node's attention is exactly its ancestors); the paper accepts from the verification branch
only. Acceptance per depth therefore counts both branches, and the tree's depth includes the
window's. Near the end of the budget, when the window is deeper than the tokens left, the step
verifies the guesses alone and the window waits.
"""

from __future__ import annotations

import random

from draftsmith.decoding.proposers.token_trie import tree_from_nodes, trie_nodes
from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.tree import Tree


class LookaheadProposer:
    """Lookahead decoding's two branches as one draft tree per step.

    Args:
        window: W, columns of the lookahead window.
        ngram: N, length of the n-grams collected (levels of the window: N-1).
        guesses: G, n-grams kept per first token and verified per step.
        seed: seed of the random tokens level 0 starts with.
    """

    name = "lookahead"
    needs_hidden_states = False

    def __init__(self, window: int = 4, ngram: int = 3, guesses: int = 4, seed: int = 0):
        if window < 1 or ngram < 2 or guesses < 1:
            raise ValueError(f"need window >= 1 ({window}), ngram >= 2 ({ngram}) and "
                             f"guesses >= 1 ({guesses})")
        self.window, self.ngram, self.guesses, self.seed = window, ngram, guesses, seed
        self.context: list[int] = []
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.levels: list[list[int]] | None = None  # level 0 (without the root), then levels 1..
        self._keys: list[int] = []  # level 0 with the root, as verified this step
        self._top: list[int] | None = None  # node index of each column's top token this step

    def reset(self, context: list[int], target_out: ForwardOutput | None = None) -> None:
        self.context, self.pool, self.levels, self._top = list(context), {}, None, None

    def propose(self, root: int, max_depth: int) -> Tree:
        if self.levels is None:
            draw = random.Random(self.seed).choice
            source = [*self.context, root]
            self.levels = [[draw(source) for _ in range(self.window + self.ngram - 3)]]
        guesses = [g[:max_depth] for g in self.pool.get(root, ())] if max_depth > 0 else []
        tokens, parents, depths = trie_nodes(root, guesses)
        self._top = None
        columns = len(self.levels[0]) + 1
        if columns - 1 + len(self.levels) - 1 <= max_depth:
            below = [0]  # level 0: the root, then a chain
            for token in self.levels[0]:
                parents.append(below[-1])
                below.append(len(tokens))
                tokens.append(token)
                depths.append(len(below) - 1)
            for level, row in enumerate(self.levels[1:], 1):
                above = []
                for column, token in enumerate(row):
                    parents.append(below[column])
                    above.append(len(tokens))
                    tokens.append(token)
                    depths.append(column + level)
                below = above
            self._top, self._keys = below, [root, *self.levels[0]]
        return tree_from_nodes(tokens, parents, depths)

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        if self._top is None:
            return
        new = target_out.logits[self._top].argmax(-1).tolist()
        rows = [self._keys, *self.levels[1:], new]
        if len(rows) < self.ngram:  # warm-up: every level moves one position, a new one on top
            self.levels = [self.levels[0][1:], *(row[1:] for row in rows[1:])]
            return
        for column, key in enumerate(rows[0]):
            self._remember(key, tuple(row[column] for row in rows[1:]))
        self.levels = [rows[1][1:], *rows[2:]]

    def _remember(self, key: int, ngram: tuple[int, ...]) -> None:
        kept = self.pool.setdefault(key, [])
        if ngram in kept:
            kept.remove(ngram)
        elif len(kept) == self.guesses:
            kept.pop(0)
        kept.append(ngram)
