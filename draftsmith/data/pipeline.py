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
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from draftsmith.data.cache import build_feature_cache
from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.config import DataRecipe
from draftsmith.data.datastore import build_datastore_step
from draftsmith.data.draft_vocab import (
    build_draft_vocab,
    save_draft_vocab,
    target_choice_counts,
    token_counts,
)
from draftsmith.data.identity import TargetIdentity, text_sha256
from draftsmith.data.ranks import ONE_PROCESS, Ranks
from draftsmith.data.regenerate import regenerate
from draftsmith.data.regeneration_server import open_regeneration_server
from draftsmith.data.render import (
    RenderedSample,
    RenderStats,
    render_conversations,
    resolve_chat_template,
)
from draftsmith.data.shards import budget_line, check_run_target, read_manifest, shard_seconds
from draftsmith.data.sources import load_conversations
from draftsmith.errors import DraftsmithError
from draftsmith.files import read_json_dict, write_atomic, write_json
from draftsmith.registry import get_spec


def _throughput(manifest: dict, tokens_key: str) -> dict:
    tokens = sum(s[tokens_key] for s in manifest["shards"])
    seconds = sum(s["seconds"] for s in manifest["shards"])
    return {"tokens": tokens, "seconds": round(seconds, 2),
            "tokens_per_second": round(tokens / seconds, 1) if seconds else None}


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
        target: the recipe's target already loaded (`draftsmith.target.Target`); None loads it
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
    report = _build_cache(recipe, target.model, target.tokenizer, samples, None,
                          stop_after_shards, False, ranks)
    log(f"rank {ranks.rank} of {ranks.world_size}: wrote {report.shards_written} cache shard(s) "
        f"({report.tokens:,} tokens); {report.shards_skipped} of its {report.shards_total} were "
        "written before")
    return {}


def _build_cache(recipe: DataRecipe, model, tokenizer, samples: list[RenderedSample],
                 template: str | None, stop_after_shards: int | None, progress: bool,
                 ranks: Ranks):
    """The recipe's hidden-state cache step (this rank's share of it)."""
    cache = recipe.data.cache
    return build_feature_cache(
        model, tokenizer, samples, Path(recipe.data.out_dir) / "cache", kinds=cache.kinds,
        dtype=cache.dtype, batch_size=cache.batch_size, batch_tokens=cache.batch_tokens,
        shard_tokens=cache.shard_tokens,
        chat_template_sha256=text_sha256(template) if template is not None else None,
        stop_after_shards=stop_after_shards, progress=progress, max_minutes=cache.max_minutes,
        aux_layers=cache.aux_layers, ranks=ranks)


def _run_steps(recipe: DataRecipe, stop_after_shards: int | None, progress: bool,
               log: Callable[[str], None], target, ranks: Ranks,
               release: Callable[[str], None]) -> dict:
    """Every step on rank 0 (`release("ready")` once the other ranks can cache)."""
    data = recipe.data
    out_dir = Path(data.out_dir)
    summary: dict = {"target": asdict(recipe.target), "data": data.to_dict()}

    conversations, cleaning = load_conversations(
        data.source, split=data.split, limit=data.limit, max_pairs=data.max_pairs)
    log(f"source {data.source}: {cleaning.summary()}")
    if not conversations:
        raise DraftsmithError(
            f"source {data.source} gave no usable conversations ({cleaning.summary()}); check the "
            "path and that it holds ShareGPT `conversations` or OpenAI `messages` records")
    summary["cleaning"] = cleaning.to_json()

    if target is None:
        target = recipe.target.load(device=ranks.device)
    model, tokenizer = target.model, target.tokenizer
    for kind in data.cache.kinds if data.cache else ():  # before regeneration, not after it
        get_spec(kind).check_target(model, repr(recipe.target.name))
    template = resolve_chat_template(tokenizer, data.chat_template)
    identity = TargetIdentity.of(model, tokenizer)
    summary["identity"] = identity.to_json()
    for folder in (out_dir / "regenerated", out_dir / "cache"):  # before tokenized.jsonl is rewritten
        check_run_target(folder, identity.to_json())

    if data.regenerate is not None:
        folder = out_dir / "regenerated"
        limit = data.regenerate.limit
        served: dict = {}
        with ExitStack() as stack:
            def connect():  # only when a shard still needs answering
                server, record = stack.enter_context(open_regeneration_server(
                    data.regenerate, recipe.target.name, model, tokenizer, template,
                    data.max_length, log, log_path=folder / "server.log"))
                served.update(record)
                return server

            report = regenerate(
                model, tokenizer, conversations[:limit], folder, template=template,
                settings=data.regenerate, max_length=data.max_length,
                eos_ids=target.eos_token_ids, identity=identity,
                stop_after_shards=stop_after_shards, progress=progress,
                server=connect if data.regenerate.backend == "openai" else None)
        manifest = read_manifest(folder)
        covered = sum(s["count"] for s in manifest["shards"])
        kept = conversations[covered:] if report.complete else []
        failed = [f for s in manifest["shards"] for f in s.get("failed", [])]
        written = sum(s["written"] for s in manifest["shards"])
        summary["regeneration"] = {
            "folder": str(folder), "complete": report.complete, "backend": data.regenerate.backend,
            "server": served or _previous_server(out_dir),
            "shards": f"{report.shards_written + report.shards_skipped}/{report.shards_total}",
            "input": covered, "conversations": written, "failed": failed,
            "skipped": covered - written - len(failed),
            "new_tokens": _throughput(manifest, "new_tokens"),
            "stops": dict(sum((Counter(s["stops"]) for s in manifest["shards"]), Counter())),
            "dropped": dict(sum((Counter(s["dropped"]) for s in manifest["shards"]), Counter())),
            "kept_as_written": len(kept),
            "budget_reached": report.budget_reached,
        }
        regen = summary["regeneration"]
        kept_cut = {why: n for why, n in regen["dropped"].items() if "conversation kept" in why}
        skipped = {why: n for why, n in regen["dropped"].items() if why not in kept_cut}
        log(f"regenerated {written:,} conversations into {folder} "
            f"({regen['new_tokens']['tokens_per_second']} new tokens/s): {covered:,} input = "
            f"{written:,} regenerated + {len(failed):,} failed + {regen['skipped']:,} skipped"
            + (f" (skipped: {', '.join(f'{n} {why}' for why, n in skipped.items())})"
               if skipped else "") + "".join(f"; {n} {why}" for why, n in kept_cut.items()))
        for failure in failed[:10]:
            log(f"  failed: conversation {failure['index']} ({failure['id']}): {failure['error']}")
        if len(failed) > 10:
            log(f"  ... {len(failed) - 10} more failures listed in {out_dir / 'summary.json'}")
        if data.regenerate.max_minutes is not None:
            log(budget_line("data.regenerate.max_minutes", shard_seconds(manifest),
                            data.regenerate.max_minutes))
        if not report.complete:
            log(f"stopped after {report.shards_written} new shard(s); run again to resume")
            return _finish(out_dir, summary, log)
        conversations = load_conversations(str(folder))[0] + kept
        if kept:
            why = ("data.regenerate.max_minutes reached" if report.budget_reached
                   else "data.regenerate.limit")
            log(f"{len(kept):,} more conversations keep their responses as written ({why})")

    render_stats = RenderStats()
    samples = render_conversations(tokenizer, conversations, template, data.max_length, render_stats)
    log(render_stats.summary())
    if not samples:
        raise DraftsmithError(
            f"every conversation was dropped when rendering ({render_stats.summary()}); nothing "
            "to write. Check data.max_length and the chat template")
    summary["rendering"] = render_stats.to_json()
    tokenized = out_dir / "tokenized.jsonl"
    lines = "".join(json.dumps({"id": s.conversation_id, "input_ids": s.input_ids,
                                "loss_mask": s.loss_mask}) + "\n" for s in samples)
    write_atomic(tokenized, lambda tmp: tmp.write_text(lines))
    summary["rendering"]["tokenized"] = str(tokenized)
    if data.datastore is not None:
        summary["datastore"] = build_datastore_step(data.datastore, samples, tokenizer, out_dir,
                                                    tokenized, log)

    if data.cache is not None:
        folder = out_dir / "cache"
        release("ready")
        report = _build_cache(recipe, model, tokenizer, samples, template, stop_after_shards,
                              progress, ranks)
        cache = FeatureCache.open(folder, expect=identity)
        summary["cache"] = {
            "folder": str(folder), "complete": report.complete, "layers": list(cache.layers),
            "samples": cache.num_samples, "bytes_per_token": round(cache.bytes_per_token, 1),
            "bytes_per_token_layout": cache.manifest["bytes_per_token_layout"],
            "extraction": _throughput(cache.manifest, "tokens"),
            "budget_reached": report.budget_reached,
        }
        log(f"cached hidden states {list(cache.layers)} of {cache.num_samples:,} conversations "
            f"({cache.num_tokens:,} tokens) in {folder}: {cache.bytes_per_token:,.0f} bytes/token, "
            f"{summary['cache']['extraction']['tokens_per_second']} tokens/s")
        if report.budget_reached:
            log(f"data.cache.max_minutes={data.cache.max_minutes:g} reached: the cache holds the "
                f"first {cache.num_samples:,} of {len(samples):,} conversations")
        if data.cache.max_minutes is not None:
            log(budget_line("data.cache.max_minutes", shard_seconds(cache.manifest),
                            data.cache.max_minutes))
        if not report.complete:
            log(f"stopped after {report.shards_written} new shard(s); run again to resume")
            return _finish(out_dir, summary, log)

    if data.draft_vocab_size is not None:
        vocab_size = int(model.config.get_text_config().vocab_size)
        counts = (target_choice_counts(out_dir / "cache", vocab_size)
                  if data.cache is not None else None)
        source = "the target's own choices on the cached conversations"
        if counts is None or not int(counts.sum()):
            counts, source = token_counts(samples, vocab_size), "the data's tokens"
        vocab = build_draft_vocab(counts, data.draft_vocab_size)
        path = save_draft_vocab(vocab, out_dir / "draft_vocab.safetensors")
        log(f"{vocab.summary()} (counted from {source}); saved {path}")
        summary["draft_vocab"] = {"path": str(path), "size": data.draft_vocab_size,
                                  "coverage": round(vocab.coverage, 6), "counted_from": source}
    return _finish(out_dir, summary, log)


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


def _previous_server(out_dir: Path) -> dict | None:
    """The server record of the run that answered the shards (a finished run starts none)."""
    previous = read_json_dict(out_dir / "summary.json") or {}
    return (previous.get("regeneration") or {}).get("server") or None
