"""The recipes that ship with draftsmith, and what a `--config` value names.

In a clone the recipes are the repository's `recipes/` folder; in an installed wheel they are
`draftsmith/recipes/` (pyproject.toml maps the one onto the other). A `--config` value is a path
when that file exists; otherwise it may name a shipped recipe relative to that folder, with or
without `.yaml` and with or without a leading `recipes/`: `llama-3.1-8b/eagle3`,
`recipes/llama-3.1-8b/eagle3.yaml`.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def recipes_root() -> Path | None:
    """The folder of the shipped recipes: the wheel's `draftsmith/recipes/`, else the clone's
    `recipes/` beside the package; None when neither exists."""
    for folder in (PACKAGE / "recipes", PACKAGE.parent / "recipes"):
        if folder.is_dir():
            return folder
    return None


def shipped_recipes() -> list[str]:
    """Every shipped recipe's name (`llama-3.1-8b/eagle3`), sorted."""
    root = recipes_root()
    if root is None:
        return []
    return sorted(path.relative_to(root).with_suffix("").as_posix()
                  for path in root.rglob("*.yaml"))


def resolve_recipe(value: str | Path) -> Path:
    """The file a `--config` value names: the path itself when it is a file (a real path wins),
    else the shipped recipe of that name, else the path unchanged (the reader then says it does
    not exist).

    Args:
        value: a path, or a recipe name such as `llama-3.1-8b/eagle3`.
    """
    path = Path(value)
    root = recipes_root()
    if path.is_file() or root is None or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts[:1] == ("recipes",) else path.parts
    if not parts or ".." in parts:
        return path
    name = Path(*parts)
    candidate = root / (name if name.suffix in (".yaml", ".yml") else name.with_name(
        name.name + ".yaml"))
    return candidate if candidate.is_file() else path
