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
    from draftsmith.registry import get_spec

    target = TargetConfig(name=recipe.target.name, dtype=recipe.target.dtype,
                          trust_remote_code=recipe.target.trust_remote_code)
    data = dict(recipe.data)
    custom = get_spec(recipe.kind).custom_aux_layers(recipe.drafter_config())
    if custom and isinstance(data.get("cache"), dict):  # the cache must hold what this drafter reads
        data["cache"] = {**data["cache"], "aux_layers": sorted(
            {*data["cache"].get("aux_layers", ()), *custom})}
    return DataRecipe(target=target, data=DataConfig.from_dict(data))


def build_examples(recipe: Recipe, accelerator, target) -> tuple[list[dict], object | None]:
    """Training examples and the draft vocabulary (or None) for a recipe's `data:` section.

    `data.tokenized: FILE.jsonl` reads pre-tokenized examples; otherwise the data pipeline runs
    (on the main process first; it resumes and skips finished work) and its rendered output is
    read back. `target` is the loaded `draftsmith.target.Target` (loaded once for everything).
    """
    from draftsmith.data.draft_vocab import load_draft_vocab
    from draftsmith.data.pipeline import run_data_recipe

    data = dict(recipe.data)
    if "tokenized" in data:
        return read_tokenized(data["tokenized"]), None
    prepared = data_recipe(recipe)
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            run_data_recipe(prepared, log=accelerator.print, target=target)
    out_dir = Path(prepared.data.out_dir)
    tokenized = out_dir / "tokenized.jsonl"
    if not tokenized.is_file():
        raise DraftsmithError(f"the data pipeline did not finish ({tokenized} is missing); "
                              "run the training command again to resume it")
    vocab_path = out_dir / "draft_vocab.safetensors"
    vocab = load_draft_vocab(vocab_path) if vocab_path.is_file() else None
    if recipe.train.features == "offline":
        return read_cache(recipe, out_dir / "cache", target), vocab
    return read_tokenized(tokenized), vocab


def read_cache(recipe: Recipe, folder: Path, target) -> list[dict]:
    """Cached samples with exactly the hidden states this drafter kind reads (offline mode).

    Raises:
        DraftsmithError: no cache, or one made by another target / tokenizer, or missing layers.
    """
    from draftsmith.data.cache import FeatureCache
    from draftsmith.data.features import hidden_key
    from draftsmith.data.identity import TargetIdentity
    from draftsmith.registry import get_spec

    if not recipe.data.get("cache"):
        raise DraftsmithError("train.features=offline needs a data.cache section listing this "
                              f"drafter kind ({recipe.kind}) in data.cache.kinds")
    num_layers = target.model.config.num_hidden_layers
    aux = get_spec(recipe.kind).aux_layers(num_layers, recipe.drafter_config())
    indices = sorted({num_layers, *[i + 1 for i in aux]})
    cache = FeatureCache.open(folder, expect=TargetIdentity.of(target.model, target.tokenizer),
                              layers=indices)
    return list(cache.iter_samples(keys=[hidden_key(i) for i in indices]))


def train_from_recipe(path: str | Path, overrides: list[str] | None = None) -> Path:
    """Load and validate the recipe, build the data, train; returns the final drafter folder."""
    import torch.distributed as dist

    from draftsmith.target import load_target
    from draftsmith.train.loop import make_accelerator, run_training

    recipe = load_recipe(path, overrides)
    if "tokenized" not in recipe.data:
        data_recipe(recipe)  # validates the data section before any model is loaded
    accelerator = make_accelerator(recipe)
    try:
        target = load_target(recipe.target.name, dtype=recipe.target.dtype, device="cpu",
                             trust_remote_code=recipe.target.trust_remote_code)
        examples, vocab = build_examples(recipe, accelerator, target)
        return run_training(recipe, examples, target=target.model, accelerator=accelerator,
                            draft_vocab=vocab)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
