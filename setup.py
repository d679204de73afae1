"""Packaging that pyproject.toml cannot say: the repository's recipes/ ships in the wheel as
draftsmith/recipes/, so `draftsmith recipes` and `--config llama-3.1-8b/eagle3` work after a
`pip install` as in a clone (draftsmith/recipes_index.py finds either). Its folders whose names
Python could import are declared too, so setuptools does not warn that it found them."""

from pathlib import Path

from setuptools import find_packages, setup

RECIPE_FOLDERS = sorted(p.name for p in Path(__file__).parent.joinpath("recipes").iterdir()
                        if p.is_dir() and p.name.isidentifier())

setup(packages=[*find_packages(include=["draftsmith*"]), "draftsmith.recipes",
                *(f"draftsmith.recipes.{name}" for name in RECIPE_FOLDERS)],
      package_dir={"draftsmith.recipes": "recipes"})
