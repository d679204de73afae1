"""Every command the README and docs/ show is one the CLI accepts (issue 56): each fenced
`draftsmith ...` and `accelerate launch ...` line is parsed by the real argument parsers without
running anything, and every recipe it names is one that ships with draftsmith.

- `draftsmith VERB ...`: `draftsmith.cli.build_parser()`.
- `accelerate launch OPTS -m draftsmith.train ARGS`: accelerate's own launch parser for OPTS, then
  `draftsmith.train`'s parser with the training itself replaced by a stub; `-m draftsmith ARGS`
  goes to `draftsmith.cli` as above.
- Recipes: every `--config` value, `plan`'s recipe, `--config_file` and any `recipes/...yaml`
  token must resolve to a shipped recipe from a folder that holds none (so only the shipped ones
  answer); an all-capitals placeholder (`RECIPE`) stands for the reader's own.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from draftsmith.recipes_index import recipes_root, resolve_recipe

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_SHELL = {"yaml", "yml", "python", "json", "toml", "text"}
SEPARATORS = {"&&", "||", ";", "|", "&"}


def _fenced_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of every shell-like fenced block, continuations joined."""
    found, fence, joined, start = [], None, "", 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else (stripped[3:].strip().lower() or "text?")
            continue
        if fence is None or fence in NOT_SHELL:
            continue
        if not joined:
            start = number
        joined += stripped.removeprefix("$ ")
        if joined.endswith("\\"):
            joined = joined[:-1] + " "
            continue
        found.append((start, joined))
        joined = ""
    return found


def _commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every draftsmith / accelerate launch command in the docs."""
    commands = []
    for path in DOCS:
        for number, line in _fenced_lines(path):
            tokens = shlex.split(line, comments=True)
            pieces, piece = [], []
            for token in [*tokens, ";"]:
                if token in SEPARATORS:
                    pieces.append(piece)
                    piece = []
                else:
                    piece.append(token)
            for argv in pieces:
                if argv and (argv[0].endswith("draftsmith") or argv[:2] == ["accelerate",
                                                                         "launch"]):
                    commands.append((f"{path.relative_to(ROOT)}:{number}", argv))
    return commands


COMMANDS = _commands()


def _placeholder(value: str) -> bool:
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", value))


def _assert_ships(value: str, where: str) -> None:
    if _placeholder(value):
        return
    path = resolve_recipe(value)
    assert path.is_file() and recipes_root() in path.resolve().parents, \
        f"{where}: {value!r} names no shipped recipe (`draftsmith recipes` lists them)"


def _parse_cli(argv: list[str], where: str, capsys):
    from draftsmith.cli import build_parser

    try:
        return build_parser().parse_args(argv)
    except SystemExit as stop:
        if stop.code == 0 and ({"-h", "--help", "--version"} & set(argv)):
            return None
        pytest.fail(f"{where}: `draftsmith {shlex.join(argv)}` is refused by the CLI:\n"
                    f"{capsys.readouterr().err}")


def _parse_train(argv: list[str], where: str, monkeypatch, capsys):
    """draftsmith.train's own parser, with the training replaced by a stub that keeps its
    arguments."""
    import importlib

    import draftsmith.process_group
    import draftsmith.train.run

    seen = {}
    monkeypatch.setattr(draftsmith.train.run, "train_from_recipe",
                        lambda config, overrides: seen.update(config=config, overrides=overrides))
    monkeypatch.setattr(draftsmith.process_group, "leave_process_group", lambda **_: None)
    main = importlib.import_module("draftsmith.train.__main__").main
    try:
        assert main(argv) == 0
    except SystemExit:
        pytest.fail(f"{where}: `python -m draftsmith.train {shlex.join(argv)}` is refused:\n"
                    f"{capsys.readouterr().err}")
    return seen


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 30, [where for where, _ in COMMANDS]
    shown = {argv[1] for _, argv in COMMANDS if argv[0].endswith("draftsmith")}
    assert {"plan", "data", "train", "export", "eval"} <= shown
    assert any(argv[:2] == ["accelerate", "launch"] for _, argv in COMMANDS)


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command_parses(where, argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no recipes/ here: only shipped recipes resolve
    for token in argv:
        if re.fullmatch(r"recipes/\S+\.ya?ml", token):
            _assert_ships(token, where)
    if argv[0].endswith("draftsmith"):
        args = _parse_cli(argv[1:], where, capsys)
        configs = getattr(args, "config", None)
        configs = configs if isinstance(configs, list) else [configs]
        for value in [*configs, getattr(args, "recipe", None)]:
            if value:
                _assert_ships(value, where)
        return
    from accelerate.commands.launch import launch_command_parser

    assert "-m" in argv, f"{where}: accelerate launch without -m MODULE"
    at = argv.index("-m")
    module, rest = argv[at + 1], argv[at + 2:]
    options = launch_command_parser().parse_args([*argv[2:at], "-m", module, *rest])
    if options.config_file:
        _assert_ships(options.config_file, where)
    if module == "draftsmith.train":
        _assert_ships(_parse_train(rest, where, monkeypatch, capsys)["config"], where)
    elif module == "draftsmith":
        args = _parse_cli(rest, where, capsys)
        _assert_ships(args.config, where)
    else:
        pytest.fail(f"{where}: accelerate launches {module}, not draftsmith")
