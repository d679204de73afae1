"""Which target hidden states each registered drafter kind reads (the registry's `aux_layers` through
`models/features.py`'s `hidden_indices`): what one hidden-state cache must hold."""

from __future__ import annotations

from collections.abc import Iterable

from draftsmith.registry import DRAFTERS, get_spec

FEATURE_KINDS = tuple(DRAFTERS)


def layers_for_kind(kind: str, num_layers: int) -> tuple[int, ...]:
    """The `hidden_states` indices a drafter kind reads with its default settings, the last
    (post-norm) state last.

    Args:
        kind: a registered kind (`FEATURE_KINDS`).
        num_layers: N, the target's number of decoder layers.

    Raises:
        DraftsmithError: unknown kind (lists the choices).
    """
    return get_spec(kind).hidden_indices(num_layers)


def layers_for_kinds(kinds: Iterable[str], num_layers: int) -> tuple[int, ...]:
    """Sorted union of `layers_for_kind` over several kinds (what one cache must hold)."""
    return tuple(sorted({i for kind in kinds for i in layers_for_kind(kind, num_layers)}))
