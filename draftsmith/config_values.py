"""Config values as their fields declare them: one YAML reader, one override parser, one converter.

Recipes, data recipes and benchmark configs are YAML mappings with `section.key=value` overrides
from the command line. Two YAML 1.1 habits would bite: `no`/`yes`/`on`/`off` become booleans
(`train.mixed_precision=no` reached the field as False) and `1e-4` stays a string. Here YAML is
read with YAML 1.2's core rules (only `true`/`false` are booleans; `1e-4` is a float), and then
each value is converted by the field's declared type (pydantic's lax conversion: "8" -> 8 for an
int field, "no" -> False for a bool field) with an error that names the key, the value and what
the field takes.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from functools import cache
from pathlib import Path

import yaml

from draftsmith.errors import DraftsmithError
from draftsmith.recipes_index import resolve_recipe


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core booleans and floats, and no duplicate keys (YAML 1.2
    forbids them; PyYAML silently keeps the last, so a repeated section lost the first)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {seen[key] + 1}); keep one",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$|^[-+]?\.(?:inf|Inf|INF)$"
               r"|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."))


def load_yaml(text: str):
    """Parse YAML text with YAML 1.2 core booleans and floats (`no` stays the string "no")."""
    return yaml.load(text, Loader=_Yaml12Loader)


def read_yaml_mapping(path: str | Path, what: str, fix: str) -> dict:
    """A YAML file that must hold a mapping (a recipe or config), read with clear errors.

    Args:
        path: the file, or the name of a shipped recipe (`llama-3.1-8b/eagle3`: see
            `recipes_index.resolve_recipe`; a file at that path wins).
        what: what the file is, for messages ("recipe", "benchmark config").
        fix: where to look when it does not exist (e.g. "see recipes/data/ for examples").

    Raises:
        DraftsmithError: a missing or unreadable file, bad YAML, or anything but a mapping.
    """
    path = resolve_recipe(path)
    if not path.is_file():
        raise DraftsmithError(f"{what} {path} does not exist; {fix} (`draftsmith recipes` lists "
                              "the shipped ones)")
    try:
        values = load_yaml(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise DraftsmithError(f"{what} {path} is not UTF-8 text (byte {err.start}); save it as "
                              "UTF-8") from None
    except yaml.YAMLError as err:
        raise DraftsmithError(f"{what} {path} is not valid YAML: {err}") from None
    if not isinstance(values, dict):
        raise DraftsmithError(f"{what} {path} must be a mapping of sections, got "
                              f"{type(values).__name__}")
    return values


def positive_int_arg(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the flag in its error)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _field_type(schema, path: list[str]):
    """The declared type at `path` inside `schema` (a dataclass or a mapping of sections to
    dataclasses), None where the path leaves the typed part."""
    node = schema
    for part in path:
        if isinstance(node, dict):
            node = node.get(part)
        elif dataclasses.is_dataclass(node):
            node = _hints(node).get(part)
        else:
            return None
        if typing.get_origin(node) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(node) if a is not type(None)]
            node = args[0] if len(args) == 1 else None
    return node


def apply_overrides(values: dict, overrides: list[str], schema=None) -> dict:
    """Apply `a.b=value` overrides to a nested dict, in place.

    A value is parsed as YAML 1.2, except for a field `schema` declares as `str`, which takes the
    text as written (`train.mixed_precision=no` is "no", `x.name=null` is "null") less one pair
    of surrounding quotes (`'train.mixed_precision="no"'`, as an older message advised, is "no").

    Args:
        values: the mapping read from the file.
        overrides: `section.key=value` strings, applied in order.
        schema: a dataclass, a mapping of section names to dataclasses, or a callable that
            returns one from the values so far (a recipe's drafter section depends on its kind).

    Raises:
        DraftsmithError: an override without `=`.
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise DraftsmithError(f"override {item!r} must look like key=value, "
                                  "e.g. data.limit=64 or data.regenerate.max_new_tokens=128")
        declared = _field_type(schema(values) if callable(schema) else schema, key.split("."))
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if declared is str:
            node[leaf] = _unquoted(raw)
            continue
        try:
            node[leaf] = load_yaml(raw)
        except yaml.YAMLError:
            node[leaf] = raw  # the field's type decides what the text means
    return values


def _unquoted(text: str) -> str:
    """`"no"` or `'no'` -> `no`; anything else as written. Quotes that the shell kept inside an
    override (`'train.mixed_precision="no"'`) are quoting, not part of the value: YAML reads them
    so in a recipe file, and no text setting of a recipe starts and ends with a quote."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        try:
            value = load_yaml(text)
        except yaml.YAMLError:
            return text
        if isinstance(value, str):
            return value
    return text


@cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _describe(tp) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_describe(a) for a in args) + (
            " or null" if len(args) < len(typing.get_args(tp)) else "")
    return {int: "an integer", float: "a number", bool: "true or false", str: "text"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _convertible(tp) -> bool:
    """Scalar fields (and optional scalars) are converted; containers and nested configs are not."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return all(_convertible(a) for a in typing.get_args(tp))
    return tp in (int, float, bool, str, type(None))


def convert_value(tp, value, name: str):
    """`value` as field type `tp` (int, float, bool, str or an optional of one).

    Raises:
        DraftsmithError: the value does not convert; the message names `name` and the type.
    """
    from pydantic import TypeAdapter, ValidationError

    if not _convertible(tp):
        return value
    wants_int = tp is int or (typing.get_origin(tp) in (typing.Union, types.UnionType)
                              and int in typing.get_args(tp) and bool not in typing.get_args(tp))
    if wants_int and isinstance(value, bool):
        raise DraftsmithError(f"{name} = {value!r}: must be {_describe(tp)}")
    try:
        return TypeAdapter(tp).validate_python(value)
    except ValidationError:
        raise DraftsmithError(f"{name} = {value!r}: must be {_describe(tp)}") from None


def build_dataclass(cls, values, prefix: str, **extra):
    """`cls(**values)` with unknown keys rejected (listing the valid ones) and every scalar value
    converted by its field's declared type.

    Args:
        cls: a dataclass.
        values: the mapping read from YAML (or an instance of `cls`, returned as is).
        prefix: where the mapping sits (`train`, `data.regenerate`), for messages.
        extra: fields set by the caller, not by the file.

    Raises:
        DraftsmithError: not a mapping, unknown keys, or a value its field does not take.
    """
    if isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise DraftsmithError(f"{prefix} must be a mapping of settings, got {values!r}")
    hints = _hints(cls)
    valid = [f.name for f in dataclasses.fields(cls) if f.name not in extra]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise DraftsmithError(f"unknown key(s) {', '.join(f'{prefix}.{k}' for k in unknown)}; "
                              f"valid keys of {prefix}: {', '.join(valid)}")
    converted = {key: convert_value(hints[key], value, f"{prefix}.{key}")
                 for key, value in values.items()}
    try:
        return cls(**converted, **extra)
    except TypeError as err:
        raise DraftsmithError(f"{prefix}: {err}") from None


def add_prompt_arguments(parser, limit: int) -> None:
    """`--bench`, `--prompts`, `--limit` and `--max-new-tokens`, as `eval` and `serve-check` take
    them (see `eval.prompts.sets.chosen_sets` / `gather_prompts`)."""
    parser.add_argument("--bench", default=None,
                        help="comma list of built-in prompt sets: mt_bench, humaneval, gsm8k, "
                        "sharegpt_long (long documents to summarise or answer from, 800-1,600 "
                        "tokens) (default: the first three, or none when --prompts is given)")
    parser.add_argument("--prompts", action="append", metavar="FILE",
                        help="a prompt file (repeatable): Spec-Bench / MT-bench question.jsonl "
                        "(`turns`, optional `category`), OpenAI `messages` JSONL, or text with "
                        "one prompt per line; reported per category, else per file")
    parser.add_argument("--limit", type=positive_int_arg, default=limit,
                        help="items per prompt set (per category of a prompt file)")
    parser.add_argument("--max-new-tokens", type=positive_int_arg, default=128)
