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


def data_recipe(recipe: Recipe):
    """The data pipeline's recipe for a training recipe (same target, its `data:` section)."""
    from draftsmith.data.config import DataConfig, DataRecipe, TargetConfig

    target = TargetConfig(name=recipe.target.name, dtype=recipe.target.dtype,
                          trust_remote_code=recipe.target.trust_remote_code)
    return DataRecipe(target=target, data=DataConfig.from_dict(recipe.data))


def build_examples(recipe: Recipe, accelerator) -> tuple[list[dict], object | None]:
    """Training examples and the draft vocabulary (or None) for a recipe's `data:` section.

    `data.tokenized: FILE.jsonl` reads pre-tokenized examples; otherwise the data pipeline runs
    (on the main process first; it resumes and skips finished work) and its rendered output is
    read back.
    """
    from draftsmith.data.draft_vocab import load_draft_vocab
    from draftsmith.data.pipeline import run_data_recipe

    data = dict(recipe.data)
    if "tokenized" in data:
        return read_tokenized(data["tokenized"]), None
    prepared = data_recipe(recipe)
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            run_data_recipe(prepared, log=accelerator.print)
    out_dir = Path(prepared.data.out_dir)
    tokenized = out_dir / "tokenized.jsonl"
    if not tokenized.is_file():
        raise DraftsmithError(f"the data pipeline did not finish ({tokenized} is missing); "
                              "run the training command again to resume it")
    vocab_path = out_dir / "draft_vocab.safetensors"
    vocab = load_draft_vocab(vocab_path) if vocab_path.is_file() else None
    if recipe.train.features == "offline":
        return read_cache(recipe, out_dir / "cache"), vocab
    return read_tokenized(tokenized), vocab


def read_cache(recipe: Recipe, folder: Path) -> list[dict]:
    """Cached samples with exactly the hidden states this drafter kind reads (offline mode).

    Raises:
        DraftsmithError: no cache, or one made by another target / tokenizer, or missing layers.
    """
    from draftsmith.data.cache import FeatureCache
    from draftsmith.data.features import hidden_key
    from draftsmith.data.identity import TargetIdentity
    from draftsmith.registry import get_spec
    from draftsmith.target import load_target

    if not recipe.data.get("cache"):
        raise DraftsmithError("train.features=offline needs a data.cache section listing this "
                              f"drafter kind ({recipe.kind}) in data.cache.kinds")
    target = load_target(recipe.target.name, dtype=recipe.target.dtype,
                         trust_remote_code=recipe.target.trust_remote_code)
    num_layers = target.model.config.num_hidden_layers
    aux = get_spec(recipe.kind).aux_layers(num_layers, recipe.drafter_config())
    indices = sorted({num_layers, *[i + 1 for i in aux]})
    cache = FeatureCache.open(folder, expect=TargetIdentity.of(target.model, target.tokenizer),
                              layers=indices)
    return list(cache.iter_samples(keys=[hidden_key(i) for i in indices]))


def train_from_recipe(path: str | Path, overrides: list[str] | None = None) -> Path:
    """Load and validate the recipe, build the data, train; returns the final drafter folder."""
    import torch.distributed as dist

    from draftsmith.train.loop import make_accelerator, run_training

    recipe = load_recipe(path, overrides)
    if "tokenized" not in recipe.data:
        data_recipe(recipe)  # validates the data section before any model is loaded
    accelerator = make_accelerator(recipe)
    try:
        examples, vocab = build_examples(recipe, accelerator)
        return run_training(recipe, examples, accelerator=accelerator, draft_vocab=vocab)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
