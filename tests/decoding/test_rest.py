"""REST: the suffix-array datastore finds what a naive scan finds, its trees keep the most frequent
continuations, decoding with it is plain greedy decoding token for token, and a datastore that
is missing, damaged or built with another tokenizer is refused with one clear error."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from draftsmith.data.datastore import (
    TENSORS,
    build_datastore,
    load_datastore,
    open_datastore,
    save_datastore,
)
from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.rest import RestProposer, frequent_prefixes
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.errors import DraftsmithError
from tests.decoding.test_decode import NEW, _prompt, _reference
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import LLAMA3, LLAMA3_SPECIALS, char_tokenizer, with_template

TOKENIZER = char_tokenizer()


def _store(documents):
    return build_datastore(documents, TOKENIZER, "test documents", "0" * 64)


def test_match_and_continuations_agree_with_a_naive_scan():
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 6, size=rng.integers(1, 30)).tolist() for _ in range(40)]
    store = _store(docs)
    for _ in range(200):
        pattern = rng.integers(2, 6, size=rng.integers(1, 4)).tolist()
        n = len(pattern)
        expect = Counter(tuple(d[i + n:i + n + 3]) for d in docs for i in range(len(d) - n + 1)
                         if d[i:i + n] == pattern)
        lo, hi = store.match(pattern)
        assert hi - lo == sum(expect.values())
        rows = store.continuations(lo, hi, n, 3, max_matches=10_000)
        got = Counter(tuple(t for t in row if t >= 0) for row in rows.tolist())
        assert got == expect  # continuations stop at their document's end


def test_longest_suffix_wins_and_misses_are_empty():
    store = _store([[7, 8, 9, 50, 51], [8, 9, 60, 61]])
    rows, length = store.lookup([1, 7, 8, 9], depth=2)
    assert length == 3 and rows.tolist() == [[50, 51]]
    rows, length = store.lookup([2, 8, 9], depth=2)
    assert length == 2 and sorted(rows.tolist()) == [[50, 51], [60, 61]]
    rows, length = store.lookup([3, 4], depth=2)
    assert length == 0 and rows.shape == (0, 2)
    assert store.report()["lookups"] == 3 and store.report()["hit_rate"] == pytest.approx(2 / 3)


def test_frequent_prefixes_are_the_most_frequent_and_connected():
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 3, size=(60, 4))
    rows[rng.random(60) < 0.2, 2:] = -1  # some continuations end early
    counts = Counter(tuple(t for t in r[:d] if t >= 0) for r in rows.tolist() for d in range(1, 5)
                     if r[d - 1] >= 0)
    chosen = frequent_prefixes(rows, 10)
    assert len(chosen) == 10 and len(set(chosen)) == 10
    assert all(p[:-1] in chosen for p in chosen if len(p) > 1)
    worst_kept = min(counts[p] for p in chosen)
    assert all(counts[p] <= worst_kept for p in counts if p not in chosen)
    assert frequent_prefixes(rows[:0], 10) == []


@pytest.mark.parametrize(("family", "seeds"), [("llama", 2), ("qwen2", 1)])
def test_rest_reproduces_plain_greedy_on_hits_and_misses(family, seeds):
    target = tiny_target(family)
    runner = CausalLMRunner(target)
    rng = np.random.default_rng(2)
    for seed in range(seeds):
        prompt = _prompt(seed)
        reference = _reference(target, prompt)
        wrong = [t if i % 5 else (t + 1) % 128 for i, t in enumerate(reference)]
        stores = {
            "exact": _store([prompt[-4:] + reference, rng.integers(2, 128, 300).tolist()]),
            "wrong": _store([prompt[-4:] + wrong]),
            "miss": _store([rng.integers(2, 128, 300).tolist()]),
        }
        for name, store in stores.items():
            for tokens in (4, 16):
                result = generate(runner, RestProposer(store, tokens), prompt, NEW)
                assert result.tokens == reference, f"{family} seed {seed} {name} {tokens}"
                if name == "exact":  # the continuation is in the datastore: drafts are accepted
                    assert sum(result.accepted_per_step) > NEW // 2


def test_rest_sampling_runs():
    target = tiny_target("llama")
    prompt = _prompt(0)
    store = _store([prompt[-4:] + _reference(target, prompt)])
    result = generate(CausalLMRunner(target), RestProposer(store, 8), prompt, NEW,
                      sampling=SamplingConfig(temperature=0.8, seed=1))
    assert len(result.tokens) == NEW and all(0 <= t < 128 for t in result.tokens)


def test_save_load_round_trip(tmp_path):
    store = _store([[5, 6, 7, 8], [6, 7, 9]])
    folder = save_datastore(store, tmp_path / "datastore")
    loaded = load_datastore(folder)
    assert np.array_equal(loaded.tokens, store.tokens)
    assert np.array_equal(loaded.suffix_array, store.suffix_array)
    assert loaded.manifest == store.manifest
    assert loaded.manifest["bytes_on_disk"] == (folder / TENSORS).stat().st_size
    assert loaded.lookup([6, 7], 1)[0].tolist() == store.lookup([6, 7], 1)[0].tolist()
    assert load_datastore(folder / TENSORS).manifest == store.manifest  # a file inside works too
    loaded.check_tokenizer(char_tokenizer(), str(folder))


def test_another_tokenizer_is_refused(tmp_path):
    folder = save_datastore(_store([[5, 6, 7]]), tmp_path / "datastore")
    other = with_template(TOKENIZER, LLAMA3, LLAMA3_SPECIALS)
    with pytest.raises(DraftsmithError, match=r"built with the tokenizer of .* not the target's"):
        open_datastore(str(folder)).check_tokenizer(other, str(folder))


def test_missing_and_damaged_datastores_are_refused(tmp_path):
    with pytest.raises(DraftsmithError, match=r"no datastore there"):
        load_datastore(tmp_path / "nowhere")
    (tmp_path / "corpus.jsonl").write_text("{}\n")
    with pytest.raises(DraftsmithError, match=r"is a file, not a datastore"):
        load_datastore(tmp_path / "corpus.jsonl")
    folder = save_datastore(_store([[5, 6, 7, 8, 9]]), tmp_path / "datastore")
    tensors = folder / TENSORS
    good = tensors.read_bytes()
    tensors.write_bytes(good[:-3] + bytes(3))  # a flipped token
    with pytest.raises(DraftsmithError, match=r"is damaged .*tokens does not match"):
        load_datastore(folder)
    tensors.write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(DraftsmithError, match=r"is damaged"):
        load_datastore(folder)
    tensors.write_bytes(good)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(DraftsmithError, match=r"is damaged"):
        load_datastore(folder)
    tensors.unlink()
    with pytest.raises(DraftsmithError, match=f"{TENSORS} is missing"):
        load_datastore(folder)
