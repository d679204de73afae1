"""Damaged data folders end in one clear error each, never a short or silent training run
(issue #18): a cache or regeneration shard truncated or deleted behind the manifest's back, a
manifest that is not JSON, a tokenized.jsonl with a bad line (a damaged draft vocabulary:
tests/draft_vocab/test_file.py)."""

from __future__ import annotations

import json

import pytest

from draftsmith.data.cache import build_feature_cache
from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.render import RenderedSample
from draftsmith.data.sources import load_conversations
from draftsmith.errors import DraftsmithError
from draftsmith.train.run import read_tokenized
from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer


@pytest.fixture
def cache(tmp_path):
    """A finished 3-shard hidden-state cache of a tiny target."""
    samples = [RenderedSample(list(range(2, 18)), [0] * 4 + [1] * 12, f"s{i}") for i in range(3)]
    folder = tmp_path / "cache"
    build_feature_cache(tiny_target("llama"), char_tokenizer(), samples, folder, kinds=["eagle1"],
                        dtype="float32", shard_tokens=16, progress=False)
    assert len(list(FeatureCache.open(folder).iter_samples())) == 3
    return folder


def test_a_truncated_cache_shard_is_refused(cache):
    shard = cache / "shard-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(DraftsmithError, match=r"cache at .* is damaged: shard-00001.safetensors "
                                              r"has 100 bytes but was written with [\d,]+ .*"
                                              r"run `draftsmith data run` again"):
        FeatureCache.open(cache)


def test_a_deleted_cache_shard_is_refused(cache):
    (cache / "shard-00002.safetensors").unlink()
    with pytest.raises(DraftsmithError, match=r"shard-00002.safetensors is listed in manifest.json "
                                              r"but missing; delete .*cache and run"):
        FeatureCache.open(cache)


def test_a_cache_shard_overwritten_with_the_same_size_is_refused_when_read(cache):
    shard = cache / "shard-00000.safetensors"
    shard.write_bytes(b"\xff" * shard.stat().st_size)
    with pytest.raises(DraftsmithError, match=r"shard-00000\.safetensors is not readable safetensors"):
        list(FeatureCache.open(cache).iter_samples())


def test_a_manifest_that_is_not_json_is_refused(cache):
    (cache / "manifest.json").write_text('{"kind": "feature_cache", "shards": [')
    with pytest.raises(DraftsmithError, match=r"manifest.json is damaged \(not valid JSON"):
        FeatureCache.open(cache)
    assert_refused(run_cli(["data", "info", str(cache)]), "manifest.json is damaged",
                   "run `draftsmith data run` again")


@pytest.mark.parametrize(("line", "message"), [
    ('{"input_ids": [5, 6], "loss_mask": [0', r"tokenized.jsonl:2 is not valid JSON"),
    ("[5, 6]", r"tokenized.jsonl:2: each line needs input_ids and loss_mask"),
    ('{"input_ids": "ab", "loss_mask": "cd"}', r"tokenized.jsonl:2: .*lists of integers"),
    ('{"input_ids": [5, 6], "loss_mask": [1]}', r"tokenized.jsonl:2: .*of equal length"),
])
def test_a_bad_tokenized_line_is_refused_with_its_number(tmp_path, line, message):
    path = tmp_path / "tokenized.jsonl"
    path.write_text('{"input_ids": [3, 4], "loss_mask": [0, 1]}\n' + line + "\n")
    with pytest.raises(DraftsmithError, match=message + r".*`draftsmith data run` again"):
        read_tokenized(path)


@pytest.fixture
def regenerated(tmp_path):
    """A regeneration folder of two finished shards of three records each."""
    folder = tmp_path / "regenerated"
    folder.mkdir()
    shards = []
    for index in range(2):
        name = f"shard-{index:05d}.jsonl"
        records = [{"id": f"c{index}{i}", "conversations": [
            {"from": "human", "value": f"Question {i}?"}, {"from": "gpt", "value": "An answer."}]}
            for i in range(3)]
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))
        shards.append({"index": index, "file": name, "count": 3, "written": 3})
    (folder / "manifest.json").write_text(json.dumps(
        {"kind": "regenerated", "settings": {}, "shards": shards}))
    assert len(load_conversations(str(folder))[0]) == 6
    return folder


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_damaged_regeneration_shard_is_refused_not_read_short(regenerated, damage):
    shard = regenerated / "shard-00001.jsonl"
    if damage == "deleted":
        shard.unlink()
        message = r"shard-00001.jsonl is listed in manifest.json but missing"
    else:
        text = shard.read_text()
        shard.write_text(text[: text.rindex('{"id"')])  # the last record lost, whole lines left
        message = r"shard-00001.jsonl holds 2 records but 3 were written \(truncated or edited\)"
    with pytest.raises(DraftsmithError, match=message + r"; delete .*regenerated and run"):
        load_conversations(str(regenerated))
