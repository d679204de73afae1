"""Small settings for every registered drafter kind, so tests that loop over the registry build
drafters that fit a tiny target and train in a second. A kind without an entry uses its
defaults, so a new kind is tested without editing this table."""

from __future__ import annotations

from draftsmith.registry import DRAFTERS

# the fewest heads / modules / TTT steps that still exercise every code path of the kind
SMALL = {"medusa": {"num_heads": 2}, "mtp": {"num_modules": 2},
         "eagle3": {"draft_vocab_size": 96, "ttt_steps": 2}}


def small_settings(kind: str) -> dict:
    """Drafter settings of `kind` sized for tiny targets (tests/helpers/tiny_targets.py)."""
    if kind not in DRAFTERS:
        raise KeyError(f"{kind!r} is not a registered drafter kind")
    return dict(SMALL.get(kind, {}))
