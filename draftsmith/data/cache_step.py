"""The data pipeline's hidden-state cache step: the recipe's `data.cache` settings passed to
`cache.build_feature_cache` (each rank writes its share), then, on rank 0, the cache opened as
training will open it and reported.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.data.cache import CacheReport, build_feature_cache
from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.config import DataRecipe
from draftsmith.data.data_run import DataRun
from draftsmith.data.identity import text_sha256
from draftsmith.data.ranks import Ranks
from draftsmith.data.render import RenderedSample
from draftsmith.data.shards import budget_line, shard_seconds, throughput


def build_recipe_cache(recipe: DataRecipe, model, tokenizer, samples: list[RenderedSample],
                       template: str | None, stop_after_shards: int | None, progress: bool,
                       ranks: Ranks) -> CacheReport:
    """This rank's share of the recipe's hidden-state cache, in `data.out_dir/cache/`
    (`template`: the chat template that rendered the samples, recorded by its hash; None on
    the ranks that did not render them)."""
    cache = recipe.data.cache
    return build_feature_cache(
        model, tokenizer, samples, Path(recipe.data.out_dir) / "cache", kinds=cache.kinds,
        dtype=cache.dtype, batch_size=cache.batch_size, batch_tokens=cache.batch_tokens,
        shard_tokens=cache.shard_tokens,
        chat_template_sha256=text_sha256(template) if template is not None else None,
        stop_after_shards=stop_after_shards, progress=progress, max_minutes=cache.max_minutes,
        aux_layers=cache.aux_layers, ranks=ranks)


def cache_step(run: DataRun, samples: list[RenderedSample]) -> dict:
    """Rank 0's part of the cache step: its share of the cache, then the whole cache (every
    rank's shards, merged) checked against the target and reported.

    Returns:
        the summary's `cache` section (`complete` false: a later run resumes the step).
    """
    folder = run.out_dir / "cache"
    report = build_recipe_cache(run.recipe, run.target.model, run.target.tokenizer, samples,
                                run.template, run.stop_after_shards, run.progress, run.ranks)
    cache = FeatureCache.open(folder, expect=run.identity)
    section = {
        "folder": str(folder), "complete": report.complete, "layers": list(cache.layers),
        "samples": cache.num_samples, "bytes_per_token": round(cache.bytes_per_token, 1),
        "bytes_per_token_layout": cache.manifest["bytes_per_token_layout"],
        "extraction": throughput(cache.manifest, "tokens"),
        "budget_reached": report.budget_reached,
    }
    _log_cache(run, cache, report, section, len(samples))
    return section


def _log_cache(run: DataRun, cache: FeatureCache, report: CacheReport, section: dict,
               num_samples: int) -> None:
    """What the cache holds and how fast it was written; its budget; whether it stopped."""
    log = run.log
    settings = run.data.cache
    log(f"cached hidden states {list(cache.layers)} of {cache.num_samples:,} conversations "
        f"({cache.num_tokens:,} tokens) in {section['folder']}: "
        f"{cache.bytes_per_token:,.0f} bytes/token, "
        f"{section['extraction']['tokens_per_second']} tokens/s")
    if report.budget_reached:
        log(f"data.cache.max_minutes={settings.max_minutes:g} reached: the cache holds the "
            f"first {cache.num_samples:,} of {num_samples:,} conversations")
    if settings.max_minutes is not None:
        log(budget_line("data.cache.max_minutes", shard_seconds(cache.manifest),
                        settings.max_minutes))
    if not report.complete:
        log(f"stopped after {report.shards_written} new shard(s); run again to resume")
