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
killed build resumes where it stopped. `FeatureCache.open` refuses a cache made by another target,
tokenizer or weights (see `identity.TargetIdentity`), and `iter_batches` streams shards
(memory-mapped, sample by sample) into padded batches: a plain generator, split across ranks by
sample. Training streams shards per rank instead (`draftsmith.train.cache_stream`).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from draftsmith.data.batching import collate, plan_batches
from draftsmith.data.features import layers_for_kind, layers_for_kinds
from draftsmith.data.identity import TargetIdentity
from draftsmith.data.ranks import ONE_PROCESS, Ranks
from draftsmith.data.render import RenderedSample
from draftsmith.data.shards import (
    MANIFEST,
    ShardReport,
    done_shards,
    merge_rank_records,
    open_run,
    rank_record,
    read_manifest,
    record_shard,
)
from draftsmith.errors import DraftsmithError
from draftsmith.files import write_atomic, write_json
from draftsmith.models.features import extract_features, hidden_key, num_decoder_layers
from draftsmith.target import DTYPES

KIND = "feature_cache"
# storage dtypes of the hidden states; float8 rows carry a float32 scale each (`scale_key`)
FEATURE_STORAGE = {**DTYPES, "float8_e4m3": torch.float8_e4m3fn}
FLOAT8_MAX = 448.0  # largest finite float8 e4m3fn value


def scale_key(key: str) -> str:
    """The per-row scales stored beside a float8 hidden-state key."""
    return f"{key}.scale"


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, H) -> (float8 e4m3 (n, H), float32 scales (n,)): each row scaled so that its largest
    magnitude maps to the format's largest value (an all-zero row keeps scale 1)."""
    amax = x.detach().float().abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FLOAT8_MAX, torch.ones_like(amax))
    return (x.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


def dequantize_rows(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float8 (n, H) and scales (n,) -> bfloat16 (n, H)."""
    return (values.float() * scale[:, None]).to(torch.bfloat16)


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
    batch_size: int, batch_tokens: int,
) -> dict[str, torch.Tensor]:
    """The packed tensors of one shard (see the module docstring), batched by length."""
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
    for rows in plan_batches(lengths, batch_size, batch_tokens):
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
    packed["input_ids"] = torch.tensor([t for s in samples for t in s.input_ids], dtype=torch.int32)
    packed["loss_mask"] = torch.tensor([m for s in samples for m in s.loss_mask], dtype=torch.uint8)
    packed["lengths"] = torch.tensor(lengths, dtype=torch.int64)
    return packed


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
    identity = TargetIdentity.of(model, tokenizer)
    plan = plan_shards([len(s.input_ids) for s in samples], shard_tokens)
    text_config = model.config.get_text_config()
    settings = {
        "target": identity.to_json(), "layers": list(layers), "feature_dtype": dtype,
        "shard_tokens": shard_tokens, "samples": len(samples), "samples_sha256": samples_sha256(samples),
    }
    def opened() -> dict:
        return open_run(out_dir, KIND, settings, extra={
            "kinds": {kind: list(layers_for_kind(kind, num_layers)) for kind in kinds},
            "num_layers": num_layers, "hidden_size": int(text_config.hidden_size),
            "vocab_size": int(text_config.vocab_size),
            "chat_template_sha256": chat_template_sha256,
            "bytes_per_token_layout": 4 + 4 + 1 + len(layers) * (
                int(text_config.hidden_size) * FEATURE_STORAGE[dtype].itemsize
                + (4 if dtype == "float8_e4m3" else 0)),
        })

    manifest = opened() if ranks.is_main else None
    if ranks.distributed and ranks.is_main:
        merge_rank_records(out_dir, manifest)  # of a shared run killed before it merged
    ranks.barrier()
    manifest = manifest or opened()  # the other ranks: rank 0's, checked against their settings
    # the shards this rank writes and has written (one process: all, the manifest itself)
    own = {"shards": [s for s in manifest["shards"] if ranks.owns(s["index"])]} \
        if ranks.distributed else manifest
    mine = [i for i in range(len(plan)) if ranks.owns(i)]
    report = CacheReport(out_dir, len(mine), shards_skipped=len(done_shards(own) & set(mine)))
    sizes = [sum(len(s.input_ids) for s in samples[start:end]) for start, end in plan]
    budget = f" (budget {max_minutes:g} min)" if max_minutes else ""
    bar = tqdm(total=sum(sizes[i] for i in mine), desc=f"hidden states{budget}",
               unit="tok", disable=not progress, smoothing=0.1)
    bar.update(sum(s["tokens"] for s in own["shards"]))
    written: list[dict] = []  # this call's shards, as this rank records them
    for index in report.pending(own, sizes, "tokens", max_minutes, stop_after_shards,
                                owns=ranks.owns):
        start, end = plan[index]
        began = time.perf_counter()
        tensors = extract_shard(model, samples[start:end], layers, FEATURE_STORAGE[dtype], batch_size,
                                batch_tokens)
        seconds = time.perf_counter() - began
        tensors["sample_index"] = torch.arange(start, end, dtype=torch.int64)
        name = f"shard-{index:05d}.safetensors"
        write_atomic(out_dir / name, lambda tmp, t=tensors: save_file(t, str(tmp)))
        tokens = int(tensors["lengths"].sum())
        size = (out_dir / name).stat().st_size
        entry = {
            "index": index, "file": name, "samples": end - start, "tokens": tokens,
            "masked_tokens": int(tensors["loss_mask"].sum()), "bytes": size,
            "seconds": round(seconds, 3),
        }
        if ranks.distributed:
            written.append(entry)
            own["shards"] = [*own["shards"], entry]
            write_json(rank_record(out_dir, ranks.rank), {"shards": written})
        else:
            record_shard(out_dir, manifest, entry)
        report.wrote(seconds, tokens)
        report.bytes_written += size
        bar.update(tokens)
    bar.close()
    if not ranks.distributed:
        return report
    parts = ranks.gather(report)  # also waits for every rank's last shard
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


class ShardReader:
    """Samples of one open shard by index: `{"input_ids", "loss_mask", key..., extra...}`, each
    read from the memory-mapped file alone. float8 hidden states come back dequantised to
    bfloat16 (`value * row scale`)."""

    def __init__(self, handle, keys: Sequence[str], extras: Sequence[str], damaged: str,
                 float8: bool):
        stored = set(handle.keys())
        wanted = ["input_ids", "loss_mask", *keys]
        scaled = list(keys) if float8 else []
        missing = [k for k in [*wanted, *(scale_key(k) for k in scaled)] if k not in stored]
        if missing:
            raise DraftsmithError(damaged % ", ".join(missing))
        self.lengths = handle.get_tensor("lengths").tolist()
        self.offsets = [0]
        for length in self.lengths:
            self.offsets.append(self.offsets[-1] + length)
        names = [*wanted, *(e for e in extras if e in stored), *(scale_key(k) for k in scaled)]
        self.slices = {k: handle.get_slice(k) for k in names}
        self.scaled = scaled

    def sample(self, i: int) -> dict[str, torch.Tensor]:
        a, b = self.offsets[i], self.offsets[i + 1]
        sample = {k: s[a:b] for k, s in self.slices.items()}
        for key in self.scaled:
            sample[key] = dequantize_rows(sample[key], sample.pop(scale_key(key)))
        sample["input_ids"] = sample["input_ids"].long()
        sample["loss_mask"] = sample["loss_mask"].long()
        return sample


class FeatureCache:
    """A cache folder opened for reading (finished shards only). Use `FeatureCache.open`."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder = folder
        self.manifest = manifest

    @classmethod
    def open(
        cls, folder: str | Path, *, expect: TargetIdentity | None = None,
        layers: Sequence[int] | None = None,
    ) -> FeatureCache:
        """Open a cache, checking who made it and what it holds.

        Args:
            folder: the cache folder.
            expect: the identity of the target about to train on it (`TargetIdentity.of`).
            layers: `hidden_states` indices the caller needs.

        Raises:
            DraftsmithError: no cache there; it was made by another target, tokenizer or weights
                (both identities named); it lacks some of `layers`.
        """
        folder = Path(folder)
        manifest = read_manifest(folder)
        if manifest is None or manifest.get("kind") != KIND:
            raise DraftsmithError(f"{folder} is not a hidden-state cache (no feature_cache "
                                  "manifest.json); build one with `draftsmith data run`")
        cache = cls(folder, manifest)
        if expect is not None and expect != cache.identity:
            raise DraftsmithError(
                f"the cache at {folder} was made with target {cache.identity.describe()}, but the "
                f"target now is {expect.describe()}; hidden states of one model are meaningless "
                "for another. Rebuild the cache with this target (`draftsmith data run` with its "
                "recipe), or train with the target that made it."
            )
        cache.check_shards()
        missing = sorted(set(layers or ()) - set(cache.layers))
        if missing:
            raise DraftsmithError(
                f"the cache at {folder} holds hidden_states {list(cache.layers)} but "
                f"{missing} are needed; rebuild it with data.cache.kinds including the drafter "
                f"kind (it was built for {', '.join(manifest['kinds'])})"
            )
        return cache

    def check_shards(self) -> None:
        """Every shard the manifest lists is on disk with the size it was written with.

        Raises:
            DraftsmithError: a listed shard is missing or has another size (truncated or
                overwritten); the message names the file and says how to rebuild the cache.
        """
        fix = f"delete {self.folder} and run `draftsmith data run` again to rebuild the cache"
        for shard in self.shards:
            path = self.folder / shard["file"]
            if not path.is_file():
                raise DraftsmithError(f"the cache at {self.folder} is damaged: {shard['file']} is "
                                      f"listed in {MANIFEST} but missing; {fix}")
            size = path.stat().st_size
            if size != shard["bytes"]:
                raise DraftsmithError(
                    f"the cache at {self.folder} is damaged: {shard['file']} has {size:,} bytes "
                    f"but was written with {shard['bytes']:,} (truncated or overwritten); {fix}")

    def _damaged(self, shard: dict) -> str:
        return (f"the cache at {self.folder} is damaged: {shard['file']} lacks %s; delete "
                f"{self.folder} and run `draftsmith data run` again")

    def _open_shard(self, shard: dict):
        """`safe_open` of one shard; a file that does not parse is a clear error."""
        from safetensors import SafetensorError

        try:
            return safe_open(self.folder / shard["file"], framework="pt")
        except (SafetensorError, OSError) as err:
            raise DraftsmithError(
                f"the cache at {self.folder} is damaged: {shard['file']} is not readable "
                f"safetensors ({err}); delete {self.folder} and run `draftsmith data run` again"
            ) from None

    @property
    def identity(self) -> TargetIdentity:
        return TargetIdentity(**self.manifest["settings"]["target"])

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(self.manifest["settings"]["layers"])

    @property
    def shards(self) -> list[dict]:
        return self.manifest["shards"]

    @property
    def complete(self) -> bool:
        return sum(s["samples"] for s in self.shards) == self.manifest["settings"]["samples"]

    @property
    def num_samples(self) -> int:
        return sum(s["samples"] for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards)

    @property
    def bytes_per_token(self) -> float:
        """Bytes on disk per token, measured over the finished shards."""
        tokens = self.num_tokens
        return sum(s["bytes"] for s in self.shards) / tokens if tokens else float("nan")

    def iter_samples(
        self, *, keys: Sequence[str] | None = None, shuffle: bool = False, seed: int = 0,
        rank: int = 0, world_size: int = 1, extras: Sequence[str] = (),
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Unpadded samples `{"input_ids", "loss_mask", "hidden_states.i" ...}`, shard by shard.

        Args:
            keys: hidden-state keys to read (default: all stored); ids and mask always come.
            extras: other per-token keys (`target_argmax`) read where a shard has them (caches
                written before they were stored lack them).
            shuffle: seeded shuffle of the shard order and of samples within each shard.
            rank, world_size: sample j of the (shuffled) stream goes to rank `j % world_size`.
        """
        keys = list(keys) if keys is not None else [hidden_key(i) for i in self.layers]
        shards = list(self.shards)
        rng = random.Random(seed)
        if shuffle:
            rng.shuffle(shards)
        position = 0
        for shard in shards:
            with self.read_shard(shard, keys, extras) as reader:
                order = list(range(len(reader.lengths)))
                if shuffle:
                    rng.shuffle(order)
                for i in order:
                    position += 1
                    if (position - 1) % world_size != rank:
                        continue
                    yield reader.sample(i)

    @contextmanager
    def read_shard(self, shard: dict, keys: Sequence[str], extras: Sequence[str] = ()
                   ) -> Iterator[ShardReader]:
        """One shard opened (memory-mapped) for reading samples by index; see `ShardReader`."""
        with self._open_shard(shard) as handle:
            yield ShardReader(handle, keys, extras, self._damaged(shard),
                              self.manifest["settings"]["feature_dtype"] == "float8_e4m3")

    def iter_batches(
        self, batch_size: int, *, keys: Sequence[str] | None = None, shuffle: bool = False,
        seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool = False,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Right-padded batches of `iter_samples` (see `batching.collate`): (B, T) ids, loss and
        attention masks, (B, T, H) hidden states in the stored dtype."""
        pending: list[dict[str, torch.Tensor]] = []
        for sample in self.iter_samples(keys=keys, shuffle=shuffle, seed=seed, rank=rank,
                                        world_size=world_size):
            pending.append(sample)
            if len(pending) == batch_size:
                yield collate(pending)
                pending = []
        if pending and not drop_last:
            yield collate(pending)

    def token_counts(self) -> torch.Tensor:
        """How often each target token id occurs where the loss mask is 1. (V,) int64"""
        counts = torch.zeros(self.manifest["vocab_size"], dtype=torch.int64)
        for shard in self.shards:
            with self._open_shard(shard) as handle:
                ids = handle.get_tensor("input_ids").long()
                mask = handle.get_tensor("loss_mask").bool()
            counts += torch.bincount(ids[mask], minlength=counts.numel())
        return counts
