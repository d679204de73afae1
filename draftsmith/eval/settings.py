"""The decoding knobs every method reads, declared once (`DecodeSettings`): the eval CLI's flags
(`add_decode_arguments`), a benchmark's `eval:` keys (`decode_settings_from_mapping`) and the
proposers all take them from these fields, with one default and one help text each. A new knob
is one field here."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from draftsmith.decoding.proposers.tree_expansion import DynamicTreeConfig
from draftsmith.errors import DraftsmithError

AUTO = "auto"  # tree_total_tokens: measure this machine and pick each dynamic tree's shape


def knob(default, help: str, **meta):
    """A DecodeSettings field: its default and the help text its flag shows."""
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class DecodeSettings:
    """Knobs of the proposers (each field is a flag `--name-with-dashes` of `draftsmith eval`
    and a key of a benchmark's `eval:` section)."""

    num_draft_tokens: int = knob(4, "chain length of the draft model and trained-drafter chains")
    block_length: int | None = knob(
        None, "proposals a block drafter (DFlash, DSpark) uses per step: its chain's length or "
        "its tree's depth (default: the whole block; with --tree-total-tokens auto, measured on "
        "this machine)")
    lookup_tokens: int = knob(8, "prompt lookup chain length")
    lookup_max_ngram: int = knob(3, "longest n-gram prompt lookup matches")
    hybrid_min_ngram: int = knob(3, "drafter_lookup: drafts from prompt lookup when it matches a "
                                 "suffix of at least this many tokens, else from the drafter")
    lookahead_window: int = knob(4, "lookahead decoding: W, columns of the Jacobi window")
    lookahead_ngram: int = knob(3, "lookahead decoding: N, n-gram size (the window has N-1 "
                                "levels)")
    lookahead_guesses: int = knob(4, "lookahead decoding: G, n-grams verified per step")
    rest_tokens: int = knob(16, "REST: draft tokens in the retrieved tree")
    tree_topk: int = knob(4, "dynamic tree: candidates kept per node")
    tree_depth: int = knob(6, "dynamic tree: draft depth")
    tree_total_tokens: int | str = knob(
        16, "draft tokens kept in the dynamic tree, or 'auto' to measure this machine, decode 4 "
        "calibration prompts with the deepest tree and pick, per dynamic-tree method, the depth "
        "and size with the best expected tokens/s")
    datastore: str | None = knob(
        None, "REST datastore: the datastore/ folder `draftsmith data run` writes with "
        "data.datastore set (adds nothing by itself: use --methods rest or --baselines)",
        metavar="DIR", bench=False)

    def __post_init__(self):
        if self.block_length is not None and (not isinstance(self.block_length, int) or
                                              isinstance(self.block_length, bool) or
                                              self.block_length < 1):
            raise DraftsmithError(f"--block-length {self.block_length!r} must be an integer >= 1 "
                                  "(leave it unset for the whole block)")
        for name in ("num_draft_tokens", "lookup_tokens", "lookup_max_ngram", "lookahead_window",
                     "lookahead_ngram", "lookahead_guesses", "rest_tokens", "hybrid_min_ngram",
                     "tree_topk", "tree_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise DraftsmithError(f"{flag(name)} {value!r} must be an integer >= 1 (0 would "
                                      "turn the method into plain decoding under another name)")
        total = self.tree_total_tokens
        if total != AUTO and (not isinstance(total, int) or isinstance(total, bool) or total < 1):
            raise DraftsmithError(f"--tree-total-tokens {total!r} must be an integer >= 1 or "
                                  f"'{AUTO}'")
        if self.lookahead_ngram < 2:
            raise DraftsmithError(f"--lookahead-ngram {self.lookahead_ngram} must be >= 2 (an "
                                  "n-gram is a token and at least one guess after it)")
        try:
            self.tree  # noqa: B018  (the tree's own checks: total_tokens against topk and depth)
        except ValueError as err:
            raise DraftsmithError(f"bad tree setting: {err}") from err

    @property
    def autotune(self) -> bool:
        """`tree_total_tokens: auto`: each dynamic tree's depth and size measured here."""
        return self.tree_total_tokens == AUTO

    @property
    def tree(self) -> DynamicTreeConfig:
        """The dynamic tree (16 tokens until `auto` picks)."""
        total = 16 if self.autotune else self.tree_total_tokens
        return DynamicTreeConfig(self.tree_topk, self.tree_depth, total)

    def with_tree(self, depth: int, total_tokens: int) -> DecodeSettings:
        """These settings with another tree depth and size (the autotuner's pick)."""
        return dataclasses.replace(self, tree_depth=depth, tree_total_tokens=total_tokens)


def flag(name: str) -> str:
    """The command-line flag of a DecodeSettings field."""
    return "--" + name.replace("_", "-")


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per DecodeSettings field, with its default and help."""
    from draftsmith.config_values import positive_int_arg

    for item in dataclasses.fields(DecodeSettings):
        kinds = {"int": positive_int_arg, "int | None": positive_int_arg,
                 "int | str": _int_or_auto, "str | None": str}
        extra = {"metavar": item.metadata["metavar"]} if "metavar" in item.metadata else {}
        parser.add_argument(flag(item.name), type=kinds[item.type], default=item.default,
                            help=item.metadata["help"], **extra)


def decode_settings_from_args(args: argparse.Namespace) -> DecodeSettings:
    """The DecodeSettings a parsed command line gives (`add_decode_arguments`)."""
    return DecodeSettings(**{f.name: getattr(args, f.name)
                             for f in dataclasses.fields(DecodeSettings)})


def bench_keys() -> list[str]:
    """The DecodeSettings fields a benchmark's `eval:` section takes (a benchmark finds its REST
    datastore itself)."""
    return [f.name for f in dataclasses.fields(DecodeSettings) if f.metadata.get("bench", True)]


def decode_settings_from_mapping(values: dict, where: str, **fixed) -> DecodeSettings:
    """DecodeSettings from a config file's keys (`bench_keys`), each converted by its type and
    named `WHERE.key` in errors; `fixed`: fields the caller sets.

    Raises:
        DraftsmithError: a value its field does not take, naming the key.
    """
    from draftsmith.config_values import build_dataclass

    try:
        return build_dataclass(DecodeSettings, values, where, **fixed)
    except DraftsmithError as err:
        text = str(err)
        for name in values:
            text = text.replace(flag(name) + " ", f"{where}.{name} = ")
        raise DraftsmithError(text) from None


def _int_or_auto(text: str) -> int | str:
    """argparse type of --tree-total-tokens: `auto` or an integer >= 1."""
    from draftsmith.config_values import positive_int_arg

    return text if text == AUTO else positive_int_arg(text)
