"""The decoding methods `draftsmith eval` compares, by name, and how each one's proposer is built."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.eval.hf_baselines import HF_METHODS
from draftsmith.eval.proposers.base import NoDraftProposer, Proposer
from draftsmith.eval.proposers.draft_model import DraftModelProposer, DraftModelTreeProposer
from draftsmith.eval.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.eval.proposers.tree_expansion import DynamicTreeConfig
from draftsmith.eval.sampling import SamplingConfig

OUR_METHODS = {
    "plain": "plain decoding through draftsmith's loop (the speedup baseline)",
    "prompt_lookup": "n-gram prompt lookup, chain",
    "draft_model": "classic draft model, chain (needs --draft-model)",
    "draft_model_tree": "classic draft model, EAGLE-2 dynamic tree (needs --draft-model)",
}
ALL_METHODS = (*OUR_METHODS, *HF_METHODS)
NEEDS_DRAFT = {"draft_model", "draft_model_tree", "hf_assisted"}


@dataclass(frozen=True)
class ProposerSettings:
    """Knobs of the proposers.

    Attributes:
        num_draft_tokens: chain length for the draft model.
        lookup_tokens: chain length for prompt lookup.
        lookup_max_ngram: longest n-gram matched by prompt lookup.
        tree: dynamic tree settings.
    """

    num_draft_tokens: int = 4
    lookup_tokens: int = 8
    lookup_max_ngram: int = 3
    tree: DynamicTreeConfig = field(default_factory=DynamicTreeConfig)


def check_methods(methods: list[str], has_draft: bool) -> None:
    """Raise a clear error for unknown methods or draft methods without a draft model."""
    for method in methods:
        if method not in ALL_METHODS:
            raise DraftsmithError(f"unknown method {method!r}; choose from: {', '.join(ALL_METHODS)}")
        if method in NEEDS_DRAFT and not has_draft:
            raise DraftsmithError(f"method {method!r} needs a classic draft model: add --draft-model")


def make_proposer(method: str, settings: ProposerSettings, sampling: SamplingConfig,
                  draft_model: torch.nn.Module | None = None) -> Proposer:
    """A fresh proposer for one of draftsmith's own methods."""
    if method == "plain":
        return NoDraftProposer()
    if method == "prompt_lookup":
        return PromptLookupProposer(settings.lookup_tokens, settings.lookup_max_ngram)
    if method == "draft_model":
        return DraftModelProposer(draft_model, settings.num_draft_tokens, sampling,
                                  torch.Generator().manual_seed(sampling.seed + 1))
    if method == "draft_model_tree":
        return DraftModelTreeProposer(draft_model, dynamic=settings.tree)
    raise DraftsmithError(f"{method!r} is not one of draftsmith's decoding methods")
