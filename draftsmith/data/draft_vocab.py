"""EAGLE-3's reduced draft vocabulary: the Vd target tokens most frequent where the loss is taken.

Convention (../shared/REFERENCE.md section 1): `used` = the chosen target ids sorted ascending;
`d2t[i] = used[i] - i` (int64, size Vd), so draft id d maps to target id `d + d2t[d]`; `t2d` is a
bool mask of size V, true on the chosen ids. Ties in frequency go to the lower token id, and when
fewer than Vd tokens were seen the rest are the lowest unseen ids, so the result is deterministic.
Coverage is the share of loss-masked target tokens inside the draft vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftsmith.data.render import RenderedSample
from draftsmith.errors import DraftsmithError
from draftsmith.files import write_atomic


@dataclass(frozen=True)
class DraftVocab:
    """A draft vocabulary. d2t: int64 (Vd,); t2d: bool (V,); coverage in [0, 1]."""

    d2t: torch.Tensor
    t2d: torch.Tensor
    coverage: float

    @property
    def draft_to_target(self) -> torch.Tensor:
        """Target id of every draft id. (Vd,) int64"""
        return torch.arange(self.d2t.numel(), dtype=torch.int64) + self.d2t

    def summary(self) -> str:
        return (f"draft vocabulary {self.d2t.numel():,} of {self.t2d.numel():,} tokens covers "
                f"{100 * self.coverage:.2f}% of the loss-masked target tokens")


def token_counts(samples: Iterable[RenderedSample], vocab_size: int) -> torch.Tensor:
    """How often each token id occurs where the loss mask is 1. (V,) int64"""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for sample in samples:
        ids = torch.tensor(sample.input_ids, dtype=torch.long)
        mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def target_choice_counts(cache_folder: str | Path, vocab_size: int) -> torch.Tensor | None:
    """How often the target itself chooses each id (V,) where the next token is trained: its
    greedy choice after every token, stored by the hidden-state cache (`target_argmax`).

    None when a shard lacks it (a cache written before draftsmith recorded it)."""
    from draftsmith.data.shards import read_manifest

    manifest = read_manifest(Path(cache_folder))
    if not manifest or not manifest.get("shards"):
        return None
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for shard in manifest["shards"]:
        with safe_open(str(Path(cache_folder) / shard["file"]), framework="pt") as handle:
            if "target_argmax" not in handle.keys():  # noqa: SIM118 (safe_open has no __contains__)
                return None
            choice = handle.get_tensor("target_argmax").to(torch.int64)
            mask = handle.get_tensor("loss_mask").bool()
            lengths = handle.get_tensor("lengths")
        ends = torch.cumsum(lengths, 0) - 1  # the last token of each sample predicts nothing here
        trained_next = torch.cat([mask[1:], mask.new_zeros(1)])
        trained_next[ends] = False
        counts += torch.bincount(choice[trained_next], minlength=vocab_size)[:vocab_size]
    return counts


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """The `draft_vocab_size` most frequent ids of `counts` (V,) as d2t/t2d.

    Raises:
        DraftsmithError: Vd is not in [1, V], or no token was counted.
    """
    vocab_size = counts.numel()
    if not 1 <= draft_vocab_size <= vocab_size:
        raise DraftsmithError(
            f"data.draft_vocab_size = {draft_vocab_size} must be between 1 and the target "
            f"vocabulary size {vocab_size}"
        )
    total = int(counts.sum())
    if total == 0:
        raise DraftsmithError("no loss-masked tokens were counted, so a draft vocabulary cannot "
                              "be chosen; check that the data has assistant turns")
    ids = torch.arange(vocab_size, dtype=torch.int64)
    # stable sort by count descending keeps ties in ascending id order
    by_frequency = ids[torch.sort(-counts.to(torch.int64), stable=True).indices]
    used = torch.sort(by_frequency[:draft_vocab_size]).values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    d2t = used - torch.arange(draft_vocab_size, dtype=torch.int64)
    return DraftVocab(d2t=d2t, t2d=t2d, coverage=int(counts[used].sum()) / total)


def save_draft_vocab(vocab: DraftVocab, path: str | Path) -> Path:
    """Write `d2t` and `t2d` to a safetensors file (coverage in its metadata), atomically."""
    path = Path(path)
    tensors = {"d2t": vocab.d2t.contiguous(), "t2d": vocab.t2d.contiguous()}
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp),
                                             metadata={"coverage": repr(vocab.coverage)}))
    return path


def load_draft_vocab(path: str | Path) -> DraftVocab:
    """Read a file written by `save_draft_vocab`.

    Raises:
        DraftsmithError: the file is missing or lacks d2t/t2d.
    """
    path = Path(path)
    if not path.is_file():
        raise DraftsmithError(f"draft vocabulary {path} does not exist; build it with "
                              "`draftsmith data run` and data.draft_vocab_size set")
    with safe_open(path, framework="pt") as handle:
        if not {"d2t", "t2d"} <= set(handle.keys()):
            raise DraftsmithError(f"{path} holds {sorted(handle.keys())}, not d2t and t2d")
        coverage = float((handle.metadata() or {}).get("coverage", "nan"))
        return DraftVocab(handle.get_tensor("d2t"), handle.get_tensor("t2d"), coverage)


def draft_vocab_step(size: int, vocab_size: int, samples: Iterable[RenderedSample],
                     cache_folder: Path | None, out_dir: Path, log: Callable[[str], None]) -> dict:
    """The data pipeline's step: the `size` most frequent of the target's `vocab_size` tokens,
    counted from the target's own choices on the cached conversations (`cache_folder`, when
    it holds them) else from the data's tokens, saved as `out_dir/draft_vocab.safetensors`.

    Returns:
        the summary's `draft_vocab` section.
    """
    counts = target_choice_counts(cache_folder, vocab_size) if cache_folder is not None else None
    source = "the target's own choices on the cached conversations"
    if counts is None or not int(counts.sum()):
        counts, source = token_counts(samples, vocab_size), "the data's tokens"
    vocab = build_draft_vocab(counts, size)
    path = save_draft_vocab(vocab, out_dir / "draft_vocab.safetensors")
    log(f"{vocab.summary()} (counted from {source}); saved {path}")
    return {"path": str(path), "size": size, "coverage": round(vocab.coverage, 6),
            "counted_from": source}
