"""The decoding methods `draftsmith eval` compares, by name, and how each one's proposer is built."""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.data.datastore import open_datastore
from draftsmith.decoding.method import NEEDS_DRAFT, NEEDS_DRAFTER, OUR_METHODS, Method
from draftsmith.decoding.proposers.base import (
    NoDraftProposer,
    Proposer,
    TreeSettings,
    drafter_family,
)
from draftsmith.decoding.proposers.draft_model import DraftModelProposer, DraftModelTreeProposer
from draftsmith.decoding.proposers.hybrid import LookupHybridProposer
from draftsmith.decoding.proposers.lookahead import LookaheadProposer
from draftsmith.decoding.proposers.prompt_lookup import PromptLookupProposer
from draftsmith.decoding.proposers.rest import RestProposer
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.errors import DraftsmithError
from draftsmith.eval.hf_baselines import HF_METHODS
from draftsmith.eval.settings import DecodeSettings
from draftsmith.registry import get_spec

ALL_METHODS = (*OUR_METHODS, *HF_METHODS)
CHAIN_METHODS = {"plain", "prompt_lookup", "draft_model"}  # besides drafters decoding chains
NEEDS_DATASTORE = {"rest"}


def check_methods(methods: list[str], has_draft: bool, drafters=(), datastore: str | None = None
                  ) -> None:
    """Raise a clear error for unknown methods, draft methods without their model, drafter
    methods naming a drafter that was not given (`drafters`: the labels given), or REST without
    an existing datastore."""
    drafters = set(drafters)
    if NEEDS_DATASTORE & set(methods) and datastore is None:
        raise DraftsmithError("method 'rest' needs a datastore: add --datastore DIR (the "
                              "datastore/ folder `draftsmith data run` writes with data.datastore)")
    if datastore is not None and not Path(datastore).exists():
        raise DraftsmithError(f"--datastore {datastore} does not exist; pass the datastore/ "
                              "folder of a data run with data.datastore set")
    for method in methods:
        base, label = (parsed := Method.parse(method)).base, parsed.label
        if base not in ALL_METHODS:
            raise DraftsmithError(f"unknown method {method!r}; choose from: {', '.join(ALL_METHODS)}"
                                  " (drafter methods may name a drafter: drafter@LABEL)")
        if base in NEEDS_DRAFT and not has_draft:
            raise DraftsmithError(f"method {method!r} needs a classic draft model: add --draft-model")
        if label and base not in NEEDS_DRAFTER:
            raise DraftsmithError(f"method {method!r}: only drafter methods take an @LABEL")
        if base in NEEDS_DRAFTER and label not in drafters:
            given = ", ".join(sorted(repr(d) for d in drafters)) or "none"
            fix = (f"add --drafter {label}=DIR" if label else "add --drafter DIR")
            raise DraftsmithError(f"method {method!r} needs a trained drafter{' ' + repr(label) if label else ''} "
                                  f"(drafters given: {given}): {fix}")


def check_hybrid_settings(methods, settings: DecodeSettings) -> None:
    """Refuse a `drafter_lookup` run whose hybrid could never draft from prompt lookup."""
    uses_hybrid = any(Method.parse(m).with_lookup for m in methods)
    if uses_hybrid and settings.hybrid_min_ngram > settings.lookup_max_ngram:
        raise DraftsmithError(f"--hybrid-min-ngram {settings.hybrid_min_ngram} exceeds "
                              f"--lookup-max-ngram {settings.lookup_max_ngram}: prompt lookup "
                              "never matches that long a suffix; lower the one or raise the other")


def tree_shape(method: str | Method, kind: str) -> str:
    """The tree shape a drafter method decodes with: `drafter` takes the kind's default."""
    return Method.parse(method).tree_shape(kind)


def decodes_chains(method: str | Method, kind: str | None = None) -> bool:
    """Whether a method drafts chains (what batched decoding runs); `kind`: its drafter's kind."""
    method = Method.parse(method)
    if method.with_lookup:  # its steps switch between two proposers
        return False
    if method.uses_drafter:
        return method.tree_shape(kind) == "chain"
    return method.base in CHAIN_METHODS


def make_drafter_proposer(method: str, drafter, settings: DecodeSettings,
                          sampling: SamplingConfig | None = None) -> Proposer:
    """A proposer for a trained drafter (`LoadedDrafter`) with the method's tree shape.

    Raises:
        DraftsmithError: a shape the kind does not decode with (names the ones it does).
    """
    spec = get_spec(drafter.kind)
    shape = tree_shape(method, drafter.kind)
    if shape not in spec.tree_shapes:
        methods = " or ".join(f"drafter_{s}" for s in spec.tree_shapes)
        raise DraftsmithError(f"{spec.title} drafters decode with {', '.join(spec.tree_shapes)} "
                              f"trees, not {shape}: use drafter or {methods}")
    tree = TreeSettings(shape, settings.num_draft_tokens, settings.tree, settings.block_length,
                        sampling)
    return drafter_family(spec.proposer)(drafter.module, tree, f"{drafter.kind}_{shape}")


def make_proposer(method: str, settings: DecodeSettings, sampling: SamplingConfig,
                  draft_model: torch.nn.Module | None = None, drafter=None) -> Proposer:
    """A fresh proposer for one of draftsmith's own methods."""
    base = Method.parse(method).base
    if base == "drafter_lookup":
        inner = make_drafter_proposer(base, drafter, settings, sampling)
        lookup = PromptLookupProposer(settings.lookup_tokens, settings.lookup_max_ngram)
        return LookupHybridProposer(inner, lookup, settings.hybrid_min_ngram,
                                    f"{inner.name}+lookup")
    if base in NEEDS_DRAFTER:
        return make_drafter_proposer(base, drafter, settings, sampling)
    if base == "plain":
        return NoDraftProposer()
    if base == "prompt_lookup":
        return PromptLookupProposer(settings.lookup_tokens, settings.lookup_max_ngram)
    if base == "lookahead":
        return LookaheadProposer(settings.lookahead_window, settings.lookahead_ngram,
                                 settings.lookahead_guesses, seed=sampling.seed)
    if base == "rest":
        return RestProposer(open_datastore(settings.datastore), settings.rest_tokens)
    if base == "draft_model":
        return DraftModelProposer(draft_model, settings.num_draft_tokens, sampling,
                                  torch.Generator().manual_seed(sampling.seed + 1))
    if base == "draft_model_tree":
        return DraftModelTreeProposer(draft_model, dynamic=settings.tree)
    raise DraftsmithError(f"{method!r} is not one of draftsmith's decoding methods")


def open_method_resources(methods, settings: DecodeSettings, tokenizer, log=print) -> None:
    """Load what the methods need besides models before any run, and say what it is: REST's
    datastore, refused when it was built with another tokenizer than the target's."""
    if NEEDS_DATASTORE & set(methods):
        datastore = open_datastore(settings.datastore)
        datastore.check_tokenizer(tokenizer, settings.datastore)
        datastore.lookup_seconds, datastore.lookup_hits = [], 0  # count this run's lookups only
        log(datastore.describe())


def method_reports(methods, settings: DecodeSettings, log=print) -> dict[str, dict]:
    """What eval.json records under a method besides the common columns: for REST, the
    datastore's build time, size on disk and lookup latency over the run."""
    reports = {}
    if NEEDS_DATASTORE & set(methods):
        report = open_datastore(settings.datastore).report()
        reports["rest"] = {"datastore": report}
        if report["lookups"]:
            log(f"rest: {report['lookups']:,} lookups, {report['hit_rate']:.0%} found a suffix, "
                f"latency p50 {report['lookup_us_p50']:.0f} us, p90 "
                f"{report['lookup_us_p90']:.0f} us")
    return reports
