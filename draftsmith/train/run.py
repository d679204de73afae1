"""From a recipe file to a trained drafter: validate, build the training examples, run the loop."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.errors import DraftsmithError
from draftsmith.process_group import leave_process_group
from draftsmith.train.recipe import Recipe, load_recipe

if TYPE_CHECKING:
    from draftsmith.train.cache_stream import CacheStream


def read_tokenized(path: str | Path) -> list[dict]:
    """Pre-tokenized examples: a JSONL file of {"input_ids": [...], "loss_mask": [...]}."""
    path = Path(path)
    if not path.is_file():
        raise DraftsmithError(f"data.tokenized file {path} does not exist")
    fix = ("rewrite the file, or delete it and run `draftsmith data run` again (the data "
           "pipeline writes OUT_DIR/tokenized.jsonl)")
    examples = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as err:
                raise DraftsmithError(f"{path}:{number} is not valid JSON ({err}); "
                                      f"{fix}") from None
            if not isinstance(row, dict) or not _token_list(row.get("input_ids")) or \
                    not _token_list(row.get("loss_mask")) or \
                    len(row["input_ids"]) != len(row["loss_mask"]):
                raise DraftsmithError(f"{path}:{number}: each line needs input_ids and loss_mask: "
                                      f"lists of integers of equal length; {fix}")
            examples.append({"input_ids": row["input_ids"], "loss_mask": row["loss_mask"]})
    return examples


def _token_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value)


def build_examples(recipe: Recipe, accelerator, target, recipe_path: str | Path = "RECIPE"
                   ) -> tuple[list[dict] | CacheStream, object | None]:
    """Training examples (or, offline, this rank's stream of the cache) and the draft vocabulary
    (or None) for a recipe's `data:` section.

    `data.tokenized: FILE.jsonl` reads pre-tokenized examples; otherwise one process runs the
    data pipeline first (it resumes and skips finished work) and its rendered output is read
    back. Several processes only read data prepared before (`draftsmith data run`, its own step).
    `target` is the loaded `draftsmith.target.load.Target` (loaded once for everything).

    Raises:
        DraftsmithError: several processes and data that is not prepared (naming the command).
    """
    from draftsmith.data.pipeline import run_data_recipe, unfinished
    from draftsmith.draft_vocab.file import read_draft_vocab
    from draftsmith.train.target_parts import holds_whole

    data = dict(recipe.data)
    if "tokenized" in data:
        return read_tokenized(data["tokenized"]), None
    prepared = recipe.data_recipe
    if accelerator.num_processes == 1:
        # a partly loaded target (offline: embeddings and head) cannot regenerate or cache: a
        # finished data run is read as it is, an unfinished one gets the whole target
        if holds_whole(target.model) or not data_ready(prepared):
            whole = target if holds_whole(target.model) else \
                recipe.target.load(device=str(accelerator.device))
            run_data_recipe(prepared, log=accelerator.print, target=whole)
            del whole
    elif (why := unfinished(prepared)) is not None:
        raise DraftsmithError(
            f"a {accelerator.num_processes}-process `train` does not prepare its data ({why}): "
            "rank 0 would regenerate and cache while the other ranks wait past the process "
            "group's timeout. Prepare it first as its own step (several processes split the "
            f"hidden-state extraction): `accelerate launch -m draftsmith data run --config "
            f"{recipe_path}` with the same data.* overrides, then launch the training again")
    out_dir = Path(prepared.data.out_dir)
    tokenized = out_dir / "tokenized.jsonl"
    if not tokenized.is_file():
        raise DraftsmithError(f"the data pipeline did not finish ({tokenized} is missing); "
                              "run the training command again to resume it")
    vocab = None  # a vocabulary left by an earlier run is not used unless the recipe asks for one
    if prepared.data.draft_vocab_size is not None:
        vocab = read_draft_vocab(out_dir / "draft_vocab.safetensors",
                                 int(target.model.config.get_text_config().vocab_size))
    if recipe.train.features == "offline":
        return stream_cache(recipe, out_dir / "cache", target, accelerator), vocab
    return read_tokenized(tokenized), vocab


def data_ready(prepared) -> bool:
    """True when an earlier data run with these very settings finished: its summary.json records
    them, with complete regeneration and cache (where asked), and tokenized.jsonl exists."""
    from draftsmith.files import read_json_dict

    out_dir = Path(prepared.data.out_dir)
    summary = read_json_dict(out_dir / "summary.json") or {}
    settings = json.loads(json.dumps(prepared.data.to_dict(), default=str))
    steps = [summary.get(step) for step, asked in (
        ("regeneration", prepared.data.regenerate), ("cache", prepared.data.cache)) if asked]
    return (summary.get("data") == settings and (out_dir / "tokenized.jsonl").is_file()
            and summary.get("target", {}).get("name") == prepared.target.name
            and all(isinstance(step, dict) and step.get("complete") for step in steps))


def load_training_target(recipe: Recipe, accelerator):
    """The frozen target as this run needs it, on this rank's device (dtype auto decided there):
    only the embeddings and head for offline features, sharded across ranks under FSDP, else
    whole (and whole when it trains through LoRA: it is then part of the trained module)."""
    from draftsmith.registry import get_spec
    from draftsmith.train.target_parts import fsdp_requested, load_loss_parts, load_sharded_target

    device = str(accelerator.device)
    sharded = fsdp_requested(accelerator)
    if get_spec(recipe.kind).trains_target(recipe.drafter_config):
        return recipe.target.load(device=device)
    if recipe.train.features == "offline" and "tokenized" not in recipe.data:
        return load_loss_parts(recipe.target, device)
    if sharded:
        return load_sharded_target(recipe.target, device)
    return recipe.target.load(device=device)


def stream_cache(recipe: Recipe, folder: Path, target, accelerator) -> CacheStream:
    """This rank's stream of the cache, with exactly the hidden states this drafter kind reads
    (offline mode), once every shard matched its recorded checksum (the processes share the
    reading).

    Raises:
        DraftsmithError: no cache, or one made by another target / tokenizer, or missing layers,
            or a damaged shard, or too few shards or samples for the processes and batch size.
    """
    import torch

    from draftsmith.data.cache_reader import FeatureCache
    from draftsmith.data.identity import TargetIdentity
    from draftsmith.models.target_states import hidden_key
    from draftsmith.registry import get_spec
    from draftsmith.train.batching import collate_rows_of
    from draftsmith.train.cache_stream import CacheStream

    if not recipe.data.get("cache"):
        raise DraftsmithError("train.features=offline needs a data.cache section listing this "
                              f"drafter kind ({recipe.kind}) in data.cache.kinds")
    num_layers = target.model.config.num_hidden_layers
    indices = get_spec(recipe.kind).hidden_indices(num_layers, recipe.drafter_config)
    cache = FeatureCache.open(folder, expect=TargetIdentity.of(target.model, target.tokenizer),
                              layers=indices)
    rank, world_size = accelerator.process_index, accelerator.num_processes
    problems = cache.checksum_problems(rank, world_size)
    # every process meets here, damaged or not: an error on one alone would leave the others
    # waiting in their first collective
    found = int(accelerator.reduce(torch.tensor([len(problems)], device=accelerator.device),
                                   "sum")[0]) if world_size > 1 else len(problems)
    if found:
        raise DraftsmithError(problems[0] if problems else
                              f"the cache at {folder} is damaged: {found} shard(s) do not match "
                              "their recorded sha256 (another process's message names them); "
                              f"delete {folder} and run `draftsmith data run` again")
    cfg = recipe.train
    return CacheStream(cache, [hidden_key(i) for i in indices], ("target_argmax",),
                       batch_size=cfg.batch_size, max_length=cfg.max_length, seed=cfg.seed,
                       eval_fraction=cfg.eval_fraction, rank=rank, world_size=world_size,
                       window=cfg.cache_window, max_held=cfg.eval_max_samples,
                       batching=cfg.batching, batch_tokens=cfg.token_budget,
                       rows=collate_rows_of(recipe))


def check_draft_vocab_source(recipe: Recipe, vocab_size: int) -> None:
    """Before the data pipeline runs: a drafter with a reduced draft vocabulary (EAGLE-3, DFlash)
    needs the data to count one of its size; its first Vd target ids would be arbitrary tokens. A
    DFlash drafter without `draft_vocab_size` drafts over every token and ignores the data's.

    Raises:
        DraftsmithError: the data builds no draft vocabulary, or one of another size.
    """
    from draftsmith.draft_vocab.drafter import missing_draft_vocab
    from draftsmith.registry import get_spec

    if not get_spec(recipe.kind).uses_draft_vocab:
        return
    chosen = recipe.drafter_config.draft_vocab_size
    if chosen is None:
        return
    wanted = min(chosen, vocab_size)
    tokenized = "tokenized" in recipe.data
    built = None if tokenized else recipe.data_recipe.data.draft_vocab_size
    if built is None and wanted < vocab_size:
        raise DraftsmithError(missing_draft_vocab(wanted, vocab_size, tokenized))
    if built is not None and built != wanted:
        raise DraftsmithError(f"data.draft_vocab_size={built} differs from "
                              f"drafter.draft_vocab_size={wanted}; set both to the same value")


def training_rows(recipe: Recipe, examples) -> Iterator[list[int]]:
    """The input ids of every training sequence, read when iterated: the examples' own, or
    (offline, where the examples are a cache stream) those of the data run's tokenized.jsonl."""
    if not isinstance(examples, list):
        examples = read_tokenized(Path(recipe.data_recipe.data.out_dir) / "tokenized.jsonl")
    for example in examples:
        yield example["input_ids"]


def train_from_recipe(path: str | Path, overrides: list[str] | None = None) -> Path:
    """Load and validate the recipe, build the data, train; returns the final drafter folder.
    A launched command leaves the process group once done (`leave_process_group`); a failed run
    leaves it here."""
    from draftsmith.files import disk_space_errors
    from draftsmith.host_memory import reuse_freed_memory
    from draftsmith.registry import get_spec
    from draftsmith.train.loop import make_accelerator, run_training
    from draftsmith.train.mask_token import warn_if_mask_token_in_data

    recipe = load_recipe(path, overrides)
    recipe.check_sections()  # a bad setting is refused before any model is loaded
    accelerator = make_accelerator(recipe)
    if recipe.train.reuse_host_memory and accelerator.device.type == "cpu":
        accelerator.print(reuse_freed_memory())
    try:
        # on this rank's device: dtype auto is decided for it (a GPU's bf16, not a CPU probe),
        # and regeneration and caching inside `train` compute there too
        target = load_training_target(recipe, accelerator)
        get_spec(recipe.kind).check_target(target.model, repr(recipe.target.name))
        check_draft_vocab_source(recipe, int(target.model.config.get_text_config().vocab_size))
        examples, vocab = build_examples(recipe, accelerator, target, path)
        warn_if_mask_token_in_data(recipe.drafter_config, target.model.config,
                                   training_rows(recipe, examples), accelerator.print)
        # checkpoints and the drafter folder: torch's "unexpected pos" on a full disk says so
        with disk_space_errors(recipe.train.output_dir, "set train.output_dir to a disk with "
                               "room (a resumed run needs its checkpoints moved there too)"):
            return run_training(recipe, examples, target=target.model, accelerator=accelerator,
                                draft_vocab=vocab)
    except BaseException:
        leave_process_group(finished=False)
        raise
