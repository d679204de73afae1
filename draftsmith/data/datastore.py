"""REST's datastore (He et al. 2024): a corpus tokenized with the target's tokenizer and indexed with
a suffix array, so that the continuations of any suffix of the context are found by binary search.

The corpus is by default the assistant answers of the run's training data (`tokenized.jsonl`,
tokens where loss_mask == 1), else a text file (documents separated by blank lines) or a JSON /
JSONL file of `input_ids` (+ `loss_mask`), `text`, or conversation records (assistant turns).
Documents are concatenated with a separator (-1) that no match or continuation crosses.

The suffix array is built by libdivsufsort through the `pydivsufsort` wheel (integer alphabets
of any size, ~0.15 s per million tokens). Saved as `datastore.safetensors` (`tokens` int32,
`suffix_array` int32/int64) and `manifest.json` (tokenizer identity, corpus hash, sizes, build
time, a sha256 per tensor so a damaged file is refused); never pickle.
"""

from __future__ import annotations

import bisect
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from draftsmith.data.identity import vocab_sha256
from draftsmith.errors import DraftsmithError
from draftsmith.files import write_atomic, write_json

MANIFEST = "manifest.json"
TENSORS = "datastore.safetensors"
KIND, FORMAT = "rest_datastore", 1
SEPARATOR = -1
REBUILD = "rebuild it with `draftsmith data run` and data.datastore set in the recipe"


def _sha256(array: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


@dataclass
class Datastore:
    """Tokens of every document (separated by -1) and their suffix array, with lookup statistics.

    Attributes:
        tokens: (n,) int32, each document followed by SEPARATOR.
        suffix_array: (n,) start of every suffix of `tokens`, in lexicographic order.
        manifest: what `manifest.json` holds (tokenizer, corpus, sizes, build time).
        lookup_seconds: wall time of every `lookup` since loading.
        lookup_hits: lookups that found a matching suffix.
    """

    tokens: np.ndarray
    suffix_array: np.ndarray
    manifest: dict
    lookup_seconds: list[float] = field(default_factory=list)
    lookup_hits: int = 0

    def _prefix(self, start: int, length: int) -> list[int]:
        return self.tokens[start:start + length].tolist()

    def match(self, pattern: list[int]) -> tuple[int, int]:
        """Suffix-array range `[lo, hi)` of the suffixes that start with `pattern` (empty: none)."""
        n = len(pattern)

        def key(start):
            return self._prefix(int(start), n)

        lo = bisect.bisect_left(self.suffix_array, pattern, key=key)
        if lo == len(self.suffix_array) or key(self.suffix_array[lo]) != pattern:
            return lo, lo
        return lo, bisect.bisect_right(self.suffix_array, pattern, lo=lo, key=key)

    def continuations(self, lo: int, hi: int, skip: int, depth: int, max_matches: int) -> np.ndarray:
        """(m, depth) tokens after the matches `lo..hi` of a pattern of length `skip`, -1 past a
        document's end; at most `max_matches` matches, evenly spaced over the range."""
        m = min(hi - lo, max_matches)
        picks = lo + (np.arange(m) * (hi - lo)) // max(m, 1)
        starts = self.suffix_array[picks].astype(np.int64) + skip
        index = np.minimum(starts[:, None] + np.arange(depth), len(self.tokens) - 1)
        out = self.tokens[index].astype(np.int64)
        out[np.cumsum(out < 0, axis=1) > 0] = SEPARATOR
        return out

    def lookup(self, context: list[int], depth: int, max_suffix: int = 16, min_suffix: int = 2,
               max_matches: int = 1000) -> tuple[np.ndarray, int]:
        """Continuations of the longest suffix of `context` found, lengths tried from long to short.

        Returns:
            `(continuations (m, depth), suffix length)`; `m` = 0 and length 0 when none matches.
        """
        start = time.perf_counter()
        found = np.zeros((0, depth), dtype=np.int64), 0
        for length in range(min(max_suffix, len(context)), min_suffix - 1, -1):
            lo, hi = self.match(context[-length:])
            if hi > lo:
                found = self.continuations(lo, hi, length, depth, max_matches), length
                self.lookup_hits += 1
                break
        self.lookup_seconds.append(time.perf_counter() - start)
        return found

    def check_tokenizer(self, tokenizer, where: str) -> None:
        """Refuse a datastore built with another tokenizer than `tokenizer` (`where`: its path)."""
        built = self.manifest["tokenizer"]
        if built["vocab_sha256"] != vocab_sha256(tokenizer):
            raise DraftsmithError(
                f"--datastore {where} was built with the tokenizer of {built['name_or_path']!r} "
                f"(vocab {built['vocab_sha256'][:12]}), not the target's "
                f"{tokenizer.name_or_path!r} (vocab {vocab_sha256(tokenizer)[:12]}): its token ids "
                f"mean other text; {REBUILD} for this target")

    def report(self) -> dict:
        """Build time, size on disk, and lookup latency and hit rate since loading."""
        seconds = np.asarray(self.lookup_seconds) * 1e6
        corpus = self.manifest["corpus"]
        return {
            "tokens": corpus["tokens"], "documents": corpus["documents"],
            "corpus": corpus["source"], "index": self.manifest["index"],
            "build_seconds": self.manifest["build_seconds"],
            "bytes_on_disk": self.manifest.get("bytes_on_disk"),
            "lookups": len(seconds),
            "hit_rate": self.lookup_hits / len(seconds) if len(seconds) else None,
            "lookup_us_p50": float(np.percentile(seconds, 50)) if len(seconds) else None,
            "lookup_us_p90": float(np.percentile(seconds, 90)) if len(seconds) else None,
            "lookup_us_mean": float(seconds.mean()) if len(seconds) else None,
        }

    def describe(self) -> str:
        r = self.report()
        size = r["bytes_on_disk"] or 0
        size = (f"{size / 2**20:.1f} MiB on disk, " if size >= 2**20 else
                f"{size / 2**10:.1f} KiB on disk, " if size else "")
        return (f"datastore: {r['tokens']:,} tokens in {r['documents']:,} documents from "
                f"{r['corpus']}, {size}suffix array built in {r['build_seconds']:.2f} s")


def masked_spans(input_ids: list[int], loss_mask: list[int] | None) -> list[list[int]]:
    """The runs of tokens where loss_mask == 1 (the assistant answers); all tokens without a mask."""
    ids = np.asarray(input_ids, dtype=np.int64)
    if loss_mask is None:
        return [ids.tolist()] if len(ids) else []
    mask = np.concatenate([[0], np.asarray(loss_mask, dtype=np.int8) == 1, [0]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(mask))
    return [ids[a:b].tolist() for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _tokenize(tokenizer, texts: Iterable[str], batch: int = 512) -> Iterator[list[int]]:
    texts = iter(texts)
    while chunk := [t for _, t in zip(range(batch), texts, strict=False)]:
        yield from tokenizer(chunk, add_special_tokens=False)["input_ids"]


def corpus_documents(path: Path, tokenizer) -> Iterator[list[int]]:
    """Token documents of a corpus file (see the module docstring for the formats).

    Raises:
        DraftsmithError: JSON records of none of the known shapes (names the keys found).
    """
    from itertools import chain

    from draftsmith.data.conversations import CleaningStats, clean_records
    from draftsmith.data.sources import JSON_SUFFIXES, read_json_records

    if not path.name.endswith(JSON_SUFFIXES):
        text = path.read_text(encoding="utf-8", errors="replace")
        yield from _tokenize(tokenizer, (d for d in re.split(r"\n\s*\n", text) if d.strip()))
        return
    records = read_json_records(path)
    first = next(records, None)
    if first is None:
        return
    records = chain([first], records)
    if "input_ids" in first:
        for record in records:
            yield from masked_spans(record["input_ids"], record.get("loss_mask"))
    elif "text" in first:
        yield from _tokenize(tokenizer, (r["text"] for r in records if r.get("text")))
    elif {"conversations", "messages"} & set(first):
        conversations = clean_records(records, path.name, CleaningStats())
        yield from _tokenize(tokenizer, (m["content"] for c in conversations
                                         for m in c.messages if m["role"] == "assistant"))
    else:
        raise DraftsmithError(
            f"data.datastore.corpus = {str(path)!r}: records have keys {sorted(first)[:6]}; give "
            "`input_ids` (+ `loss_mask`), `text`, or `conversations` / `messages` records")


def build_datastore(documents: Iterable[list[int]], tokenizer, source: str, corpus_sha256: str,
                    max_tokens: int | None = None) -> Datastore:
    """Concatenate the documents (up to `max_tokens` tokens) and build their suffix array.

    Raises:
        DraftsmithError: the corpus holds no tokens.
    """
    from importlib.metadata import version

    import pydivsufsort

    start = time.perf_counter()
    pieces, total, count = [], 0, 0
    for doc in documents:
        doc = doc[: max_tokens - total] if max_tokens is not None else doc
        if doc:
            pieces += [np.asarray(doc, dtype=np.int32), np.full(1, SEPARATOR, dtype=np.int32)]
            total, count = total + len(doc), count + 1
        if max_tokens is not None and total >= max_tokens:
            break
    if not total:
        raise DraftsmithError(f"the datastore corpus {source} holds no tokens; point "
                              "data.datastore.corpus at a non-empty file, or null for the answers")
    tokens = np.concatenate(pieces)
    suffix_array = pydivsufsort.divsufsort(tokens)
    if len(tokens) < 2**31:
        suffix_array = suffix_array.astype(np.int32)
    manifest = {
        "kind": KIND, "format": FORMAT,
        "tokenizer": {"name_or_path": str(tokenizer.name_or_path),
                      "vocab_sha256": vocab_sha256(tokenizer), "vocab_size": len(tokenizer)},
        "corpus": {"source": source, "sha256": corpus_sha256, "documents": count,
                   "tokens": total, "max_tokens": max_tokens},
        "index": f"suffix array (pydivsufsort {version('pydivsufsort')})",
        "tensors": {name: {"dtype": str(a.dtype), "length": len(a), "sha256": _sha256(a)}
                    for name, a in (("tokens", tokens), ("suffix_array", suffix_array))},
        "build_seconds": round(time.perf_counter() - start, 4),
    }
    return Datastore(tokens, suffix_array, manifest)


def save_datastore(datastore: Datastore, folder: str | Path) -> Path:
    """Write `datastore.safetensors`, then `manifest.json` (last: a complete datastore has both)."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    (folder / MANIFEST).unlink(missing_ok=True)
    tensors = {"tokens": datastore.tokens, "suffix_array": datastore.suffix_array}
    path = write_atomic(folder / TENSORS, lambda tmp: save_file(tensors, str(tmp)))
    datastore.manifest["bytes_on_disk"] = path.stat().st_size
    write_json(folder / MANIFEST, datastore.manifest)
    return folder


def load_datastore(path: str | Path) -> Datastore:
    """Read a folder written by `save_datastore` (or a file inside it), checking every tensor.

    Raises:
        DraftsmithError: no datastore there, or a damaged manifest or tensor file.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    folder = Path(path)
    if folder.is_file() and folder.name not in (MANIFEST, TENSORS):
        raise DraftsmithError(f"--datastore {path} is a file, not a datastore; pass the "
                              f"datastore/ folder of a data run (it holds {MANIFEST} and {TENSORS})")
    folder = folder.parent if folder.is_file() else folder
    if not (folder / MANIFEST).is_file() or not (folder / TENSORS).is_file():
        missing = TENSORS if (folder / MANIFEST).is_file() else MANIFEST
        raise DraftsmithError(f"--datastore {path}: no datastore there ({folder / missing} is "
                              f"missing); pass the datastore/ folder of a data run, or {REBUILD}")
    damaged = f"--datastore {path} is damaged"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("kind") != KIND or manifest.get("format") != FORMAT:
            raise ValueError(f"kind {manifest.get('kind')!r}, format {manifest.get('format')!r}")
        arrays = load_file(str(folder / TENSORS))
        for name, expect in manifest["tensors"].items():
            array = arrays[name]
            if str(array.dtype) != expect["dtype"] or len(array) != expect["length"] or \
                    _sha256(array) != expect["sha256"]:
                raise ValueError(f"{name} does not match its manifest entry")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SafetensorError) as err:
        raise DraftsmithError(f"{damaged} ({type(err).__name__}: {err}); {REBUILD}") from None
    return Datastore(arrays["tokens"], arrays["suffix_array"], manifest)


def build_datastore_step(config, samples, tokenizer, out_dir: Path, tokenized: Path,
                         log: Callable[[str], None]) -> dict:
    """The data pipeline's step: build `out_dir/datastore/` from `data.datastore` and report it.

    Args:
        config: `DatastoreConfig` (corpus None = the rendered samples' assistant answers).
        samples: the run's rendered samples (input_ids, loss_mask), as in `tokenized`.
        tokenizer: the target's tokenizer (corpus files are tokenized with it).
        out_dir: the run's data.out_dir.
        tokenized: the run's tokenized.jsonl (hashed as the default corpus).
        log: where the one-line report goes.
    """
    from draftsmith.files import sha256_file

    if config.corpus is None:
        source, documents = str(tokenized), (span for s in samples
                                             for span in masked_spans(s.input_ids, s.loss_mask))
    else:
        path = Path(config.corpus).expanduser()
        if not path.is_file():
            raise DraftsmithError(f"data.datastore.corpus = {config.corpus!r} does not exist; "
                                  "name a text or JSONL file, or null for the run's answers")
        source, documents = str(path), corpus_documents(path, tokenizer)
    datastore = build_datastore(documents, tokenizer, source, sha256_file(Path(source)),
                                config.max_tokens)
    folder = save_datastore(datastore, out_dir / "datastore")
    log(f"{datastore.describe()}; saved {folder}")
    return {"folder": str(folder), **{k: v for k, v in datastore.report().items()
                                      if not k.startswith(("lookup", "hit"))}}


def open_datastore(path: str) -> Datastore:
    """The datastore at `path`, loaded once per process and shared by every prompt's proposer
    (loaded again when its files change)."""
    folder = Path(path).parent if Path(path).is_file() else Path(path)
    stamp = tuple((f.stat().st_size, f.stat().st_mtime_ns) if f.is_file() else None
                  for f in (folder / MANIFEST, folder / TENSORS))
    return _load(path, stamp)


@lru_cache(maxsize=4)
def _load(path: str, stamp: tuple) -> Datastore:
    return load_datastore(path)
