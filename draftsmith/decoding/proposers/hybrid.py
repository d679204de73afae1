"""A trained drafter that hands a step to prompt lookup when the context holds a strong match.

Prompt lookup costs nothing to draft and is nearly always right where the output copies its
context (code, quoted text, a list restated), but most of its matches are a single repeated token
that the target rarely continues. A trained drafter guesses everywhere, at the price of its own
forwards. The hybrid (as SuffixDecoding's hybrid with a model drafter) proposes prompt lookup's
chain when the matched suffix is at least `min_ngram` tokens long and the drafter's tree otherwise,
so a copying step costs no drafter forward. Either tree goes through the same verifier, so the
output stays the target's own. The drafter still follows every accepted token (`skip`), so its
own state is complete when the next step is its turn.
"""

from __future__ import annotations

from draftsmith.decoding.proposers.base import SkippableProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.tree import Tree


class LookupHybridProposer:
    """Prompt lookup's chain on a match of >= `min_ngram` tokens, else the drafter's tree.

    Args:
        drafter: a trained drafter's proposer with `skip(root)` (feature drafters, Medusa, MTP).
        lookup: the prompt lookup proposer (its `num_tokens` is the chain's length).
        min_ngram: shortest matched suffix that makes a step prompt lookup's.
        name: method name in reports.
    """

    def __init__(self, drafter: SkippableProposer, lookup: PromptLookupProposer, min_ngram: int,
                 name: str):
        if min_ngram < lookup.min_ngram or min_ngram > lookup.max_ngram:
            raise ValueError(f"min_ngram {min_ngram} must lie in prompt lookup's n-gram range "
                             f"{lookup.min_ngram}..{lookup.max_ngram}")
        self.drafter = drafter
        self.lookup = lookup
        self.min_ngram = min_ngram
        self.name = name
        self.needs_hidden_states = drafter.needs_hidden_states
        self.lookup_steps = self.drafter_steps = 0

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        self.drafter.reset(context, target_out)
        self.lookup.reset(context, target_out)

    def propose(self, root: int, max_depth: int) -> Tree:
        chain = self.lookup.propose(root, max_depth)
        if chain.size > 1 and self.lookup.matched_ngram >= self.min_ngram:
            self.drafter.skip(root)
            self.lookup_steps += 1
            return chain
        self.drafter_steps += 1
        return self.drafter.propose(root, max_depth)

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        self.drafter.observe(path_tokens, target_out, path)
        self.lookup.observe(path_tokens, target_out, path)
