"""The data recipe end to end: conversations -> regeneration -> rendering -> hidden-state cache ->
draft vocabulary, each step resumable, with a `summary.json` of counts and throughput.

Outputs under `data.out_dir`:
    regenerated/              sharded JSONL + manifest (when `data.regenerate` is set)
    tokenized.jsonl           {"id", "input_ids", "loss_mask"} per conversation (online training)
    cache/                    safetensors shards + manifest (when `data.cache` is set)
    draft_vocab.safetensors   d2t / t2d (when `data.draft_vocab_size` is set)
    datastore/                REST datastore: suffix array + manifest (when `data.datastore` is set)
    summary.json              what was kept and dropped, tokens/s, bytes per token, coverage
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.cache_step import build_recipe_cache, cache_step
from draftsmith.data.config import DataConfig, DataRecipe
from draftsmith.data.conversations import Conversation
from draftsmith.data.data_run import DataRun
from draftsmith.data.datastore import build_datastore_step
from draftsmith.data.identity import TargetIdentity
from draftsmith.data.ranks import ONE_PROCESS, Ranks
from draftsmith.data.regeneration_step import regeneration_step
from draftsmith.data.render import (
    RenderedSample,
    RenderStats,
    render_conversations,
    resolve_chat_template,
)
from draftsmith.data.shards import check_run_target
from draftsmith.data.sources import load_conversations
from draftsmith.draft_vocab.counting import draft_vocab_step
from draftsmith.errors import DraftsmithError
from draftsmith.files import read_json_dict, write_atomic, write_json
from draftsmith.registry import get_spec


def run_data_recipe(
    recipe: DataRecipe, *, stop_after_shards: int | None = None, progress: bool = True,
    log: Callable[[str], None] = print, target=None, ranks: Ranks = ONE_PROCESS,
) -> dict:
    """Run every step the recipe asks for and return (and write) the summary.

    Args:
        recipe: the validated recipe.
        stop_after_shards: stop each sharded step after this many new shards (a later run resumes).
        progress: show progress bars.
        log: where one-line reports go.
        target: the recipe's target already loaded (`draftsmith.target.load.Target`); None loads it
            (on the rank's device when several processes share the run).
        ranks: the processes of the run (`data/ranks.py`). Rank 0 runs every step; the others
            wait for its rendered samples and write their share of the hidden-state cache
            (they return an empty summary).

    Raises:
        DraftsmithError: any user-fixable problem (source, target, template, settings), and a
            source or rendering that leaves no conversations (nothing is written then).
    """
    if not ranks.is_main:
        return _cache_share(recipe, ranks, stop_after_shards, target, log)
    released = []

    def release(status: str) -> None:  # the other ranks wait for this, once
        if ranks.distributed and not released:
            released.append(ranks.share(status))

    try:
        return _run_steps(recipe, stop_after_shards, progress, log, target, ranks, release)
    finally:
        release("stopped")  # nothing for them to cache: an unfinished step, no cache, an error


def _cache_share(recipe: DataRecipe, ranks: Ranks, stop_after_shards: int | None,
                 target, log: Callable[[str], None]) -> dict:
    """A rank other than 0: load the target on this rank's device meanwhile, wait for rank 0's
    rendered samples (`tokenized.jsonl`), then write this rank's shards of the cache."""
    target = target or recipe.target.load(device=ranks.device)
    if ranks.share(None) != "ready":
        return {}
    data = recipe.data
    with open(Path(data.out_dir) / "tokenized.jsonl", encoding="utf-8") as handle:
        samples = [RenderedSample(row["input_ids"], row["loss_mask"], row["id"])
                   for row in map(json.loads, handle)]
    report = build_recipe_cache(recipe, target.model, target.tokenizer, samples, None,
                                stop_after_shards, False, ranks)
    log(f"rank {ranks.rank} of {ranks.world_size}: wrote {report.shards_written} cache shard(s) "
        f"({report.tokens:,} tokens); {report.shards_skipped} of its {report.shards_total} were "
        "written before")
    return {}


def _run_steps(recipe: DataRecipe, stop_after_shards: int | None, progress: bool,
               log: Callable[[str], None], target, ranks: Ranks,
               release: Callable[[str], None]) -> dict:
    """Every step on rank 0 (`release("ready")` once the other ranks can cache)."""
    data = recipe.data
    summary: dict = {"target": asdict(recipe.target), "data": data.to_dict()}
    conversations, summary["cleaning"] = _load_source(data, log)
    run = _open_target(recipe, target, ranks, stop_after_shards, progress, log)
    summary["identity"] = run.identity.to_json()
    if data.regenerate is not None:
        summary["regeneration"], conversations = regeneration_step(run, conversations)
        if conversations is None:  # unfinished: a later run resumes it
            return _finish(run.out_dir, summary, log)
    samples, summary["rendering"] = _render(run, conversations)
    if data.datastore is not None:
        summary["datastore"] = build_datastore_step(
            data.datastore, samples, run.target.tokenizer, run.out_dir, run.tokenized, log)
    if data.cache is not None:
        release("ready")
        summary["cache"] = cache_step(run, samples)
        if not summary["cache"]["complete"]:
            return _finish(run.out_dir, summary, log)
    if data.draft_vocab_size is not None:
        vocab_size = int(run.target.model.config.get_text_config().vocab_size)
        summary["draft_vocab"] = draft_vocab_step(data.draft_vocab_size, vocab_size, samples,
                                                  _cache_shards(run.out_dir, data), run.out_dir, log)
    return _finish(run.out_dir, summary, log)


def _cache_shards(out_dir: Path, data: DataConfig) -> list[Path]:
    """The finished cache's shard files, where the target's own choices are stored (none when
    the recipe builds no cache)."""
    if data.cache is None:
        return []
    cache = FeatureCache.open(out_dir / "cache")
    return [cache.folder / shard["file"] for shard in cache.shards]


def _load_source(data: DataConfig, log: Callable[[str], None]) -> tuple[list[Conversation], dict]:
    """The source's cleaned conversations and the summary's `cleaning` section.

    Raises:
        DraftsmithError: the source gave no usable conversation.
    """
    conversations, cleaning = load_conversations(
        data.source, split=data.split, limit=data.limit, max_pairs=data.max_pairs)
    log(f"source {data.source}: {cleaning.summary()}")
    if not conversations:
        raise DraftsmithError(
            f"source {data.source} gave no usable conversations ({cleaning.summary()}); check the "
            "path and that it holds ShareGPT `conversations` or OpenAI `messages` records")
    return conversations, cleaning.to_json()


def _open_target(recipe: DataRecipe, target, ranks: Ranks, stop_after_shards: int | None,
                 progress: bool, log: Callable[[str], None]) -> DataRun:
    """The run with its target: loaded unless given, checked for the cache's drafter kinds and
    for any earlier output in `data.out_dir`, with its chat template and identity.

    Raises:
        DraftsmithError: the target does not suit a kind, has no chat template, or an earlier
            run in `data.out_dir` was made with another target.
    """
    data, out_dir = recipe.data, Path(recipe.data.out_dir)
    if target is None:
        target = recipe.target.load(device=ranks.device)
    for kind in data.cache.kinds if data.cache else ():  # before regeneration, not after it
        get_spec(kind).check_target(target.model, repr(recipe.target.name))
    template = resolve_chat_template(target.tokenizer, data.chat_template)
    identity = TargetIdentity.of(target.model, target.tokenizer)
    for folder in (out_dir / "regenerated", out_dir / "cache"):  # before tokenized.jsonl is rewritten
        check_run_target(folder, identity.to_json())
    return DataRun(recipe, target, template, identity, ranks, stop_after_shards, progress, log)


def _render(run: DataRun, conversations: list[Conversation]) -> tuple[list[RenderedSample], dict]:
    """The conversations rendered through the chat template with their loss masks, written to
    `tokenized.jsonl` (what online training and the other ranks read), and the summary's
    `rendering` section.

    Raises:
        DraftsmithError: rendering dropped every conversation (nothing is written then).
    """
    data, stats = run.data, RenderStats()
    samples = render_conversations(run.target.tokenizer, conversations, run.template,
                                   data.max_length, stats)
    run.log(stats.summary())
    if not samples:
        raise DraftsmithError(
            f"every conversation was dropped when rendering ({stats.summary()}); nothing "
            "to write. Check data.max_length and the chat template")
    tokenized = run.tokenized
    lines = "".join(json.dumps({"id": s.conversation_id, "input_ids": s.input_ids,
                                "loss_mask": s.loss_mask}) + "\n" for s in samples)
    write_atomic(tokenized, lambda tmp: tmp.write_text(lines))
    return samples, {**stats.to_json(), "tokenized": str(tokenized)}


def unfinished(recipe: DataRecipe) -> str | None:
    """Why the recipe's data is not ready to train on (None when every step it asks for has
    finished with these settings), read from `summary.json` without loading anything."""
    data = recipe.data
    out_dir = Path(data.out_dir)
    summary = read_json_dict(out_dir / "summary.json")
    if summary is None or not (out_dir / "tokenized.jsonl").is_file():
        return f"{out_dir} holds no finished data run"
    if json.loads(json.dumps(summary.get("data"), default=str)) != \
            json.loads(json.dumps(data.to_dict(), default=str)):
        return f"{out_dir} was prepared with other data settings"
    for step, configured in (("regeneration", data.regenerate), ("cache", data.cache)):
        if configured is not None and not (summary.get(step) or {}).get("complete"):
            return f"its {step} step has not finished"
    if data.draft_vocab_size is not None and "draft_vocab" not in summary:
        return "its draft vocabulary is not built"
    return None


def _finish(out_dir: Path, summary: dict, log: Callable[[str], None]) -> dict:
    path = out_dir / "summary.json"
    write_json(path, summary)
    log(f"summary: {path}")
    return summary
