"""Small settings for every registered drafter kind, so tests that loop over the registry build
drafters that fit a tiny target and train in a second. A kind without an entry uses its
defaults, so a new kind is tested without editing this table; a setting that changes what
trains (Medusa's shared head) is a variant, trained by the same tests."""

from __future__ import annotations

import pytest

from draftsmith.registry import DRAFTERS, get_spec

# the fewest heads / modules / TTT steps that still exercise every code path of the kind
SMALL = {"medusa": {"num_heads": 2}, "mtp": {"num_modules": 2},
         "eagle3": {"draft_vocab_size": 96, "ttt_steps": 2},
         "dflash": {"block_size": 4, "num_layers": 1, "anchors_per_sequence": 8},
         "dspark": {"block_size": 3, "num_layers": 1, "anchors_per_sequence": 8,
                    "markov_rank": 8}}
# settings that change which parameters train, each a case of the shared training tests
VARIANTS = {"medusa": {"shared_head": {"shared_head": True}},
            "eagle3": {"eagle3.1": {"fc_norm": True, "norm_output": True}},
            "dflash": {"draft-vocab": {"draft_vocab_size": 96}}}


def small_settings(kind: str) -> dict:
    """Drafter settings of `kind` sized for tiny targets (tests/helpers/tiny_targets.py)."""
    if kind not in DRAFTERS:
        raise KeyError(f"{kind!r} is not a registered drafter kind")
    return dict(SMALL.get(kind, {}))


def training_cases() -> list:
    """pytest params (kind, settings): every registered kind with its small settings, and each
    of its VARIANTS on top of them (ids `medusa`, `medusa-shared_head`, ...)."""
    cases = []
    for kind in DRAFTERS:
        cases.append(pytest.param(kind, small_settings(kind), id=kind))
        for name, extra in VARIANTS.get(kind, {}).items():
            cases.append(pytest.param(kind, {**small_settings(kind), **extra},
                                      id=f"{kind}-{name}"))
    return cases


def training_vocab(kind: str, settings: dict, target, examples: list[dict]):
    """The draft vocabulary a drafter of `kind` trains with, counted from the loss-masked tokens of
    `examples` as the data pipeline counts it without a cache; None for kinds without one."""
    from draftsmith.data.render import RenderedSample
    from draftsmith.draft_vocab.counting import token_counts
    from draftsmith.draft_vocab.vocab import build_draft_vocab

    spec = get_spec(kind)
    if not spec.uses_draft_vocab:
        return None
    samples = [RenderedSample(e["input_ids"], e["loss_mask"]) for e in examples]
    vocab_size = target.config.vocab_size
    chosen = spec.make_config(settings).draft_vocab_size
    if chosen is None:  # DFlash without one drafts over every token
        return None
    size = min(chosen, vocab_size)
    return build_draft_vocab(token_counts(samples, vocab_size), size)
