"""From a recipe file to a trained drafter: validate, build the training examples, run the loop."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.train.recipe import Recipe, load_recipe


def read_tokenized(path: str | Path) -> list[dict]:
    """Pre-tokenized examples: a JSONL file of {"input_ids": [...], "loss_mask": [...]}."""
    path = Path(path)
    if not path.is_file():
        raise DraftsmithError(f"data.tokenized file {path} does not exist")
    examples = []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "input_ids" not in row or "loss_mask" not in row or \
                    len(row["input_ids"]) != len(row["loss_mask"]):
                raise DraftsmithError(f"{path}:{number}: each line needs input_ids and loss_mask "
                                      "of equal length")
            examples.append({"input_ids": row["input_ids"], "loss_mask": row["loss_mask"]})
    return examples


def build_examples(recipe: Recipe) -> list[dict]:
    """Training examples for a recipe's `data:` section."""
    data = dict(recipe.data)
    if "tokenized" in data:
        return read_tokenized(data["tokenized"])
    raise DraftsmithError("recipe section 'data' needs 'tokenized: FILE.jsonl' (pre-tokenized "
                          "input_ids and loss_mask)")


def train_from_recipe(path: str | Path, overrides: list[str] | None = None) -> Path:
    """Load and validate the recipe, build the data, train; returns the final drafter folder."""
    import torch.distributed as dist

    from draftsmith.train.loop import run_training

    recipe = load_recipe(path, overrides)
    try:
        return run_training(recipe, build_examples(recipe))
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
