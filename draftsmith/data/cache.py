"""Offline hidden-state cache: sharded safetensors files of the features drafters train on.

Layout of a cache folder:

    manifest.json            target identity, kinds and layers, shard list, token counts, bytes/token
    shard-00000.safetensors  one shard of whole sequences, packed end to end (no padding):
        input_ids        int32   (tokens,)
        loss_mask        uint8   (tokens,)
        lengths          int64   (samples,)      sequence lengths, in order
        sample_index     int64   (samples,)      position of each sequence in the input list
        hidden_states.i  bf16    (tokens, H)     exactly the indices the kinds need (`features`)
        hidden_states.i.scale  float32 (tokens,) with `dtype: float8_e4m3` only: hidden_states.i
                                 is then float8 e4m3, each row divided by its scale (dequantised
                                 to bf16 on read); about half of bf16's bytes

Logits are not stored: EAGLE-3's target distribution is `lm_head(hidden_states[N])`, recomputed by
the frozen head at training time (a V-sized row per token would cost ~V/H times the last state;
even top-k logits do not pay: the recompute is ~2% of a step, benchmarks/memory/README.md).
Shards are planned from the input up front, written atomically and recorded in the manifest, so a
killed build resumes where it stopped. Reading (`FeatureCache`) is `data/cache_reader.py`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from draftsmith.data.batching import plan_batches
from draftsmith.data.cache_reader import KIND, scale_key
from draftsmith.data.features import layers_for_kind, layers_for_kinds
from draftsmith.data.identity import TargetIdentity
from draftsmith.data.ranks import ONE_PROCESS, Ranks
from draftsmith.data.render import RenderedSample
from draftsmith.data.shards import (
    ShardReport,
    done_shards,
    merge_rank_records,
    open_run,
    rank_record,
    record_shard,
    shard_seconds,
)
from draftsmith.errors import DraftsmithError
from draftsmith.files import sha256_file, write_atomic, write_json
from draftsmith.models.target_states import extract_features, hidden_key, num_decoder_layers
from draftsmith.target.load import DTYPES

# storage dtypes of the hidden states; float8 rows carry a float32 scale each (`scale_key`)
FEATURE_STORAGE = {**DTYPES, "float8_e4m3": torch.float8_e4m3fn}
FLOAT8_MAX = 448.0  # largest finite float8 e4m3fn value


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, H) -> (float8 e4m3 (n, H), float32 scales (n,)): each row scaled so that its largest
    magnitude maps to the format's largest value (an all-zero row keeps scale 1)."""
    amax = x.detach().float().abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FLOAT8_MAX, torch.ones_like(amax))
    return (x.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


@dataclass
class CacheReport(ShardReport):
    """What a `build_feature_cache` call did (this call only; `tokens`: tokens read)."""

    bytes_written: int = 0


def plan_shards(lengths: Sequence[int], shard_tokens: int) -> list[tuple[int, int]]:
    """Split samples into consecutive `[start, end)` ranges of about `shard_tokens` tokens each."""
    plan, start, total = [], 0, 0
    for i, length in enumerate(lengths):
        total += length
        if total >= shard_tokens:
            plan.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(lengths):
        plan.append((start, len(lengths)))
    return plan


def samples_sha256(samples: Sequence[RenderedSample]) -> str:
    """Fingerprint of the rendered inputs (token ids and masks, in order)."""
    digest = hashlib.sha256()
    for sample in samples:
        digest.update(torch.tensor(sample.input_ids, dtype=torch.int32).numpy().tobytes())
        digest.update(bytes(sample.loss_mask))
        digest.update(b"|")
    return digest.hexdigest()


def extract_shard(
    model, samples: Sequence[RenderedSample], layers: Sequence[int], dtype: torch.dtype,
    batch_size: int, batch_tokens: int, deadline: float | None = None,
) -> tuple[dict[str, torch.Tensor], list[int]]:
    """The packed tensors of one shard (see the module docstring), batched by length, and the
    indices of the samples they hold: all of them, or with a `deadline` (`time.perf_counter()`)
    those whose batches ran before it (no batch starts that would end more than half of itself
    past it, at the last batch's pace; the first always runs). A budget thus ends within half a
    batch of itself even where one shard takes longer than the whole budget (Qwen2.5-1.5B in
    float32 on 2 AVX2 cores: 33 tokens/s, a 16K-token shard 8 minutes)."""
    lengths = [len(s.input_ids) for s in samples]
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    hidden_size = model.config.get_text_config().hidden_size
    packed = {hidden_key(i): torch.empty((offsets[-1], hidden_size), dtype=dtype) for i in layers}
    scaled = dtype == torch.float8_e4m3fn
    if scaled:
        packed.update({scale_key(hidden_key(i)): torch.empty(offsets[-1]) for i in layers})
    # the target's own greedy choice after every token (its head on the last hidden state): what
    # the EAGLE-3 draft vocabulary is counted from, one forward instead of one per epoch
    last = hidden_key(num_decoder_layers(model))
    head = model.get_output_embeddings()
    packed["target_argmax"] = torch.empty(offsets[-1], dtype=torch.int32)
    device = next(model.parameters()).device
    done: list[int] = []
    batch_seconds = 0.0
    for rows in plan_batches(lengths, batch_size, batch_tokens):
        if deadline is not None and done and time.perf_counter() + batch_seconds / 2 > deadline:
            break
        began = time.perf_counter()
        width = max(lengths[i] for i in rows)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, i in enumerate(rows):
            input_ids[row, : lengths[i]] = torch.tensor(samples[i].input_ids)
            attention_mask[row, : lengths[i]] = 1
        features = extract_features(model, input_ids.to(device), attention_mask.to(device), layers)
        with torch.no_grad():
            choice = head(features[last].to(head.weight.dtype)).argmax(-1)
        for key, value in features.items():
            for row, i in enumerate(rows):
                rows_of = value[row, : lengths[i]].to("cpu")
                if scaled:
                    rows_of, packed[scale_key(key)][offsets[i]: offsets[i + 1]] = \
                        quantize_rows(rows_of)
                packed[key][offsets[i]: offsets[i + 1]] = rows_of.to(dtype)
        for row, i in enumerate(rows):
            packed["target_argmax"][offsets[i]: offsets[i + 1]] = choice[row, : lengths[i]].cpu()
        done.extend(rows)
        batch_seconds = time.perf_counter() - began
    kept = sorted(done)
    if len(kept) < len(samples):  # the deadline came: keep the rows of the samples that ran
        rows_of = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in kept])
        packed = {key: value[rows_of] for key, value in packed.items()}
    chosen = [samples[i] for i in kept]
    packed["input_ids"] = torch.tensor([t for s in chosen for t in s.input_ids], dtype=torch.int32)
    packed["loss_mask"] = torch.tensor([m for s in chosen for m in s.loss_mask], dtype=torch.uint8)
    packed["lengths"] = torch.tensor([lengths[i] for i in kept], dtype=torch.int64)
    return packed, kept


def build_feature_cache(
    model, tokenizer, samples: Sequence[RenderedSample], out_dir: str | Path, *,
    kinds: Sequence[str], dtype: str = "bfloat16", batch_size: int = 32,
    batch_tokens: int = 8192, shard_tokens: int = 32768, chat_template_sha256: str | None = None,
    stop_after_shards: int | None = None, progress: bool = True, max_minutes: float | None = None,
    aux_layers: Sequence[int] = (), ranks: Ranks = ONE_PROCESS,
) -> CacheReport:
    """Run the frozen target over rendered samples and store the hidden states `kinds` need.

    Args:
        model, tokenizer: the frozen target (its identity goes into the manifest).
        samples: rendered conversations, in a fixed order.
        out_dir: the cache folder; a previous build with the same settings is resumed.
        kinds: drafter kinds (`features.FEATURE_KINDS`); the union of their layers is stored.
        dtype: storage dtype of the hidden states (`bfloat16`, `float16`, `float32`, or
            `float8_e4m3`: half of bf16's bytes, one float32 scale per row, read back as bf16).
        batch_size, batch_tokens: at most this many sequences, and padded tokens, per forward.
        shard_tokens: tokens per shard (whole sequences, so a shard may exceed it).
        chat_template_sha256: recorded for reference (the template that rendered the samples).
        stop_after_shards: write at most this many new shards, then return.
        progress: show a tqdm bar.
        max_minutes: wall-clock budget, summed over runs: no new shard once the finished ones
            took it, nor one that would end more than half of itself past it
            (`shards.budget_has_room`); the cache then holds a prefix of the samples and counts
            as complete.
        aux_layers: 0-based layer outputs to store besides the kinds' defaults.
        ranks: the processes sharing the build (`data/ranks.py`): each writes the shards it owns
            and records them in its own file; rank 0 opens the manifest first and merges every
            rank's records into it once all have finished. The budget and `stop_after_shards`
            count per rank. Rank 0's report sums every rank's; the others report their own.

    Raises:
        DraftsmithError: `out_dir` holds a cache with other settings, or no samples were given.
    """
    if not samples:
        raise DraftsmithError("no samples to cache: every conversation was dropped; check the "
                              "source, data.limit and data.max_length")
    out_dir = Path(out_dir)
    num_layers = num_decoder_layers(model)
    layers = tuple(sorted(set(layers_for_kinds(kinds, num_layers)) | {i + 1 for i in aux_layers}))
    plan = plan_shards([len(s.input_ids) for s in samples], shard_tokens)
    settings, extra = _manifest_fields(model, tokenizer, samples, kinds, layers, dtype,
                                       shard_tokens, chat_template_sha256)
    manifest = _join_run(out_dir, lambda: open_run(out_dir, KIND, settings, extra=extra), ranks)
    records = _RankRecords(out_dir, manifest, ranks)
    mine = [i for i in range(len(plan)) if ranks.owns(i)]
    report = CacheReport(out_dir, len(mine),
                         shards_skipped=len(done_shards(records.own) & set(mine)))
    sizes = [sum(len(s.input_ids) for s in samples[start:end]) for start, end in plan]
    budget = f" (budget {max_minutes:g} min)" if max_minutes else ""
    bar = tqdm(total=sum(sizes[i] for i in mine), desc=f"hidden states{budget}",
               unit="tok", disable=not progress, smoothing=0.1)
    bar.update(sum(s["tokens"] for s in records.own["shards"]))
    writer = _ShardWriter(model, samples, plan, layers, FEATURE_STORAGE[dtype], batch_size,
                          batch_tokens, max_minutes, out_dir)
    error = _write_pending(writer, records, report, sizes, max_minutes, stop_after_shards, bar,
                           ranks)
    bar.close()
    if not ranks.distributed:
        return report
    return _merge_ranks(out_dir, manifest, report, error, ranks)


def _manifest_fields(model, tokenizer, samples: Sequence[RenderedSample], kinds: Sequence[str],
                     layers: Sequence[int], dtype: str, shard_tokens: int,
                     chat_template_sha256: str | None) -> tuple[dict, dict]:
    """The cache's settings (everything that decides its shards: a resumed build must match
    them) and the fields a new manifest stores beside them."""
    num_layers = num_decoder_layers(model)
    text_config = model.config.get_text_config()
    settings = {
        "target": TargetIdentity.of(model, tokenizer).to_json(), "layers": list(layers),
        "feature_dtype": dtype, "shard_tokens": shard_tokens, "samples": len(samples),
        "samples_sha256": samples_sha256(samples),
    }
    extra = {
        "kinds": {kind: list(layers_for_kind(kind, num_layers)) for kind in kinds},
        "num_layers": num_layers, "hidden_size": int(text_config.hidden_size),
        "vocab_size": int(text_config.vocab_size),
        "chat_template_sha256": chat_template_sha256,
        "bytes_per_token_layout": 4 + 4 + 1 + len(layers) * (
            int(text_config.hidden_size) * FEATURE_STORAGE[dtype].itemsize
            + (4 if dtype == "float8_e4m3" else 0)),
    }
    return settings, extra


def _join_run(out_dir: Path, open_manifest: Callable[[], dict], ranks: Ranks) -> dict:
    """The run's manifest on every rank: rank 0 opens (or starts) the run and folds in the
    records of a shared run killed before it merged them, then the others join it (rank 0's,
    checked against their settings). A rank's error in either turn reaches every rank
    (`Ranks.raise_if_any`), so none is left waiting for the others.

    Raises:
        DraftsmithError: some rank could not open the run.
    """
    manifest = None
    for turn in ("main", "others"):
        error = None
        if ranks.is_main == (turn == "main"):
            try:
                manifest = open_manifest()
                if ranks.distributed and ranks.is_main:
                    merge_rank_records(out_dir, manifest)
            except DraftsmithError as err:
                error = str(err)
        ranks.raise_if_any(error)
    return manifest


class _RankRecords:
    """The shards this rank writes and has written (`own`; one process: all, the manifest
    itself), and where it records a new one: the manifest (one process), or its own record
    file that rank 0 merges (`shards.merge_rank_records`: one writer per file)."""

    def __init__(self, out_dir: Path, manifest: dict, ranks: Ranks):
        self.out_dir, self.manifest, self.ranks = out_dir, manifest, ranks
        self.own = {"shards": [s for s in manifest["shards"] if ranks.owns(s["index"])]} \
            if ranks.distributed else manifest
        self.written: list[dict] = []  # this call's shards, as this rank records them

    def record(self, entry: dict) -> None:
        if not self.ranks.distributed:
            record_shard(self.out_dir, self.manifest, entry)
            return
        index = entry["index"]
        self.written = [*(s for s in self.written if s["index"] != index), entry]
        self.own["shards"] = [*(s for s in self.own["shards"] if s["index"] != index), entry]
        write_json(rank_record(self.out_dir, self.ranks.rank), {"shards": self.written})


@dataclass
class _ShardWriter:
    """Writes one planned shard: the target's features of its samples (`extract_shard`), saved
    atomically, and the manifest entry that records it, with the file's sha256 (checked before
    training reads it)."""

    model: object
    samples: Sequence[RenderedSample]
    plan: list[tuple[int, int]]
    layers: Sequence[int]
    storage: torch.dtype
    batch_size: int
    batch_tokens: int
    max_minutes: float | None
    out_dir: Path

    def write(self, index: int, spent: float) -> tuple[dict, float]:
        """Shard `index`'s manifest entry (`partial` when the budget cut it: a later run with
        room redoes it whole) and the seconds it took (`spent`: the seconds the budget already
        counts)."""
        start, end = self.plan[index]
        began = time.perf_counter()
        deadline = None if self.max_minutes is None else \
            began + self.max_minutes * 60 - spent
        tensors, kept = extract_shard(self.model, self.samples[start:end], self.layers,
                                      self.storage, self.batch_size, self.batch_tokens, deadline)
        seconds = time.perf_counter() - began
        tensors["sample_index"] = torch.tensor(kept, dtype=torch.int64) + start
        path = self.out_dir / f"shard-{index:05d}.safetensors"
        write_atomic(path, lambda tmp: save_file(tensors, str(tmp)))
        entry = {
            "index": index, "file": path.name, "samples": len(kept),
            "tokens": int(tensors["lengths"].sum()),
            "masked_tokens": int(tensors["loss_mask"].sum()), "bytes": path.stat().st_size,
            "sha256": sha256_file(path), "seconds": round(seconds, 3),
        }
        if len(kept) < end - start:
            entry["partial"] = True
        return entry, seconds


def _write_pending(writer: _ShardWriter, records: _RankRecords, report: CacheReport,
                   sizes: Sequence[int], max_minutes: float | None,
                   stop_after_shards: int | None, bar: tqdm, ranks: Ranks) -> str | None:
    """Write and record this rank's shards still to write, counting them in `report`. Returns
    the error that stopped a rank of several (None: none), which the caller brings to every
    rank: a rank that raised alone would leave the others waiting at the gather.

    Raises:
        DraftsmithError: what stopped a run of one process.
    """
    try:
        for index in report.pending(records.own, sizes, "tokens", max_minutes,
                                    stop_after_shards, owns=ranks.owns):
            entry, seconds = writer.write(index, shard_seconds(records.own))
            if entry.get("partial"):
                report.budget_reached = True
            records.record(entry)
            report.wrote(seconds, entry["tokens"])
            report.bytes_written += entry["bytes"]
            bar.update(entry["tokens"])
            if entry.get("partial"):
                break
    except DraftsmithError as err:
        if not ranks.distributed:
            raise
        return str(err)
    return None


def _merge_ranks(out_dir: Path, manifest: dict, report: CacheReport, error: str | None,
                 ranks: Ranks) -> CacheReport:
    """Once every rank finished (or one failed: then all raise), rank 0 merges their records
    into the manifest. Rank 0's report sums every rank's; the others report their own."""
    parts = ranks.gather(report)  # also waits for every rank's last shard
    ranks.raise_if_any(error)
    if ranks.is_main:
        merge_rank_records(out_dir, manifest)
    ranks.barrier()
    if not ranks.is_main:
        return report
    return CacheReport(
        out_dir, sum(p.shards_total for p in parts), sum(p.shards_written for p in parts),
        sum(p.shards_skipped for p in parts), sum(p.tokens for p in parts),
        sum(p.seconds for p in parts), any(p.budget_reached for p in parts),
        sum(p.bytes_written for p in parts))
