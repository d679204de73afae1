"""Prompt lookup (n-gram) drafting: propose what followed the last earlier occurrence of the suffix.

Training-free; strong on inputs the output copies from (code edits, summaries, quoted text). The
n-gram index is updated incrementally, so a lookup costs O(max_ngram) whatever the context length.
"""

from __future__ import annotations

from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.tree import Tree, chain_tree


class PromptLookupProposer:
    """Chain proposer from n-gram matches in the prompt and the text generated so far.

    Args:
        num_tokens: longest chain proposed.
        max_ngram: longest suffix matched (tried first).
        min_ngram: shortest suffix matched.
    """

    name = "prompt_lookup"
    needs_hidden_states = False

    def __init__(self, num_tokens: int = 8, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram ({min_ngram}) <= max_ngram ({max_ngram})")
        self.num_tokens = num_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}
        self.matched_ngram = 0  # length of the suffix the last proposal matched (0: none)

    def reset(self, context: list[int], target_out: ForwardOutput | None = None) -> None:
        self.tokens, self.index = [], {}
        for token in context:
            self._append(token)

    def _append(self, token: int) -> None:
        # Register n-grams ending at the current last token before appending, so the index only
        # holds occurrences that have a continuation.
        end = len(self.tokens) - 1
        for n in range(self.min_ngram, self.max_ngram + 1):
            if end - n + 1 >= 0:
                self.index[tuple(self.tokens[end - n + 1:end + 1])] = end
        self.tokens.append(token)

    def propose(self, root: int, max_depth: int) -> Tree:
        self._append(root)
        self.matched_ngram = 0
        limit = min(self.num_tokens, max_depth)
        if limit > 0:
            for n in range(self.max_ngram, self.min_ngram - 1, -1):
                end = self.index.get(tuple(self.tokens[-n:])) if len(self.tokens) >= n else None
                if end is not None:
                    self.matched_ngram = n
                    return chain_tree(root, self.tokens[end + 1:end + 1 + limit])
        return chain_tree(root, [])

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        for token in path_tokens[1:]:
            self._append(token)
