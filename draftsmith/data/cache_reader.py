"""Offline hidden-state cache, the reading side: `FeatureCache.open` checks who made a cache and
what it holds (refusing one made by another target, tokenizer or weights: `identity.TargetIdentity`)
and `iter_batches` streams shards (memory-mapped, sample by sample) into padded batches: a plain
generator, split across ranks by sample. Training streams shards per rank instead
(`draftsmith.train.cache_stream`). The layout is `data/cache.py`'s, which writes it.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open

from draftsmith.data.batching import collate
from draftsmith.data.identity import TargetIdentity
from draftsmith.data.shards import MANIFEST, read_manifest
from draftsmith.errors import DraftsmithError
from draftsmith.files import sha256_file
from draftsmith.models.target_states import hidden_key

KIND = "feature_cache"


def scale_key(key: str) -> str:
    """The per-row scales stored beside a float8 hidden-state key."""
    return f"{key}.scale"


def dequantize_rows(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float8 (..., H) and scales (...) -> bfloat16 (..., H), on their device."""
    return (values.float() * scale[..., None].float()).to(torch.bfloat16)


class ShardReader:
    """Samples of one open shard by index: `{"input_ids", "loss_mask", key..., extra...}`, each
    read from the memory-mapped file alone. float8 hidden states come back dequantised to
    bfloat16 (`value * row scale`), or as stored with their scales (`dequantize=False`: a quarter
    of the bytes to copy; training dequantises on its device, `train/loader.py`)."""

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

    def sample(self, i: int, dequantize: bool = True) -> dict[str, torch.Tensor]:
        a, b = self.offsets[i], self.offsets[i + 1]
        sample = {k: s[a:b] for k, s in self.slices.items()}
        for key in self.scaled if dequantize else ():
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

    def checksum_problems(self, rank: int = 0, world_size: int = 1) -> list[str]:
        """Shards whose bytes differ from the sha256 recorded when they were written (a flipped
        bit keeps a shard's size); this process checks shards `i % world_size == rank`, so
        several processes share the reading.

        Returns:
            One message per damaged shard, naming it and the fix; a cache written before shards
            recorded their checksum gives one notice that it cannot be verified.
        """
        fix = f"delete {self.folder} and run `draftsmith data run` again to rebuild the cache"
        problems, unverified = [], 0
        for i, shard in enumerate(self.shards):
            if i % world_size != rank:
                continue
            if "sha256" not in shard:
                unverified += 1
            elif sha256_file(self.folder / shard["file"]) != shard["sha256"]:
                problems.append(f"the cache at {self.folder} is damaged: {shard['file']} does not "
                                f"match the sha256 recorded when it was written; {fix}")
        if unverified and rank == 0:
            print(f"note: the cache at {self.folder} was written before shards recorded a "
                  "checksum, so its contents cannot be verified; rebuild it to have them checked",
                  file=sys.stderr)
        return problems

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
