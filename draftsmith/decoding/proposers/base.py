"""The contract every proposer implements, the decoding families of trained drafters, and the
no-draft proposer of plain decoding.

A decoding family turns a trained drafter module into a proposer for one tree shape. Each family
registers itself in the module that holds its proposer (`@register_family("feature")`), and a
drafter kind names its family in the registry (`DrafterSpec.proposer`), so a new family is one
module: nothing else lists the families.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from torch import nn

from draftsmith.decoding.proposers.tree_expansion import DynamicTreeConfig
from draftsmith.decoding.runner import ForwardOutput
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.decoding.tree import Tree, root_only_tree
from draftsmith.errors import DraftsmithError


class Proposer(Protocol):
    """Builds a draft tree each step and follows what the target accepted.

    The decoding loop calls `reset` once per prompt with the committed context (the whole
    prompt, at least one token) and the target's prefill output over it, whose logits at the last
    prompt token chose the first new token, as in plain decoding. Then per step
    `propose(root, ...)`, where root is the last chosen token (the first new token, then each
    step's bonus token: not yet forwarded by the target), and `observe` with the accepted path's
    tokens (root first) and the target's outputs for those nodes. So at every `propose` the
    target has forwarded every token before the root, and its outputs for them have come through
    `reset` and `observe`.

    Attributes:
        name: the method's name in reports.
        needs_hidden_states: the proposer reads every layer's hidden states of the target's
            forwards (`ForwardOutput.hidden_states`; EAGLE-3's fused features), so the runner must
            return them; the last hidden state is always there.
    """

    name: str
    needs_hidden_states: bool

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        """Start a prompt: `context` (the prompt) is committed in the target's cache, `target_out`
        is the prefill's output (logits at its last token, hidden states of all its tokens)."""

    def propose(self, root: int, max_depth: int) -> Tree:
        """The tree to verify after `root`, at most `max_depth` drafts deep."""

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        """Follow the accepted path (`path` node indices, `path_tokens` their tokens, root first);
        `target_out` holds the target's outputs at every node of the verified tree."""


class SkippableProposer(Proposer, Protocol):
    """A proposer that can let another draft a step and still follow the text (the prompt-lookup
    hybrid hands it the steps where prompt lookup matches)."""

    def skip(self, root: int) -> None:
        """This step's tree came from elsewhere: remember `root` so the next `observe` and
        `propose` stay in step with the target."""


@dataclass(frozen=True)
class TreeSettings:
    """The tree a trained drafter's proposer grows for one method.

    Attributes:
        shape: `chain`, `static` or `dynamic` (one of the kind's `tree_shapes`).
        chain_length: drafts in a chain.
        dynamic: EAGLE-2 expansion settings of a dynamic tree (a block drafter's best-first tree
            takes its `total_tokens` and `topk`).
        block_length: proposals a block drafter's step uses (its chain, its tree's depth); None =
            the whole block.
        sampling: the run's sampling settings, for families that sample their drafts (block
            drafters' chains); None = greedy.
    """

    shape: str
    chain_length: int = 4
    dynamic: DynamicTreeConfig = field(default_factory=DynamicTreeConfig)
    block_length: int | None = None
    sampling: SamplingConfig | None = None


# (drafter module, tree settings, method name) -> its proposer
DrafterFamily = Callable[[nn.Module, TreeSettings, str], Proposer]
FAMILIES: dict[str, DrafterFamily] = {}


def register_family(name: str) -> Callable[[DrafterFamily], DrafterFamily]:
    """Decorator: register a decoding family under `name` (what `DrafterSpec.proposer` names)."""
    def register(factory: DrafterFamily) -> DrafterFamily:
        FAMILIES[name] = factory
        return factory
    return register


def drafter_family(name: str) -> DrafterFamily:
    """The decoding family `name`; every proposer module of this package is imported once first,
    so each registers its own family.

    Raises:
        DraftsmithError: no family of that name (lists the registered ones).
    """
    if name not in FAMILIES:
        package = importlib.import_module(__package__)
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{__package__}.{module.name}")
    if name not in FAMILIES:
        raise DraftsmithError(f"no decoding family {name!r}; registered: "
                              f"{', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


class NoDraftProposer:
    """Plain decoding: the tree is the root alone, so every step verifies one token."""

    name = "plain"
    needs_hidden_states = False

    def reset(self, context: list[int], target_out: ForwardOutput) -> None:
        pass

    def propose(self, root: int, max_depth: int) -> Tree:
        return root_only_tree(root, "cpu")  # host-built; the loop moves it to the target

    def observe(self, path_tokens: list[int], target_out: ForwardOutput, path: list[int]) -> None:
        pass
