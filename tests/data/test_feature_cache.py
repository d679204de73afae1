"""Hidden states: the layers each kind needs, online extraction, and the offline cache (round trip
equal to online, resume, refusal of another target or tokenizer)."""

import pytest
import torch

from draftsmith.data.cache import build_feature_cache, plan_shards
from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.conversations import Conversation
from draftsmith.data.features import layers_for_kind, layers_for_kinds
from draftsmith.data.identity import TargetIdentity
from draftsmith.data.render import render_conversations, resolve_chat_template
from draftsmith.draft_vocab.counting import token_counts
from draftsmith.errors import DraftsmithError
from draftsmith.models.target_states import extract_features, hidden_key
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer


def test_layers_for_each_kind():
    for kind in ("medusa", "eagle1", "mtp"):
        assert layers_for_kind(kind, 30) == (30,)
    assert layers_for_kind("eagle3", 30) == (2, 15, 27, 30)  # layer outputs 1, 14, 26 + last
    assert layers_for_kind("eagle3", 24) == (2, 12, 21, 24)
    assert layers_for_kinds(["medusa", "eagle3"], 30) == (2, 15, 27, 30)
    with pytest.raises(DraftsmithError, match="choose one of: medusa"):
        layers_for_kind("hydra", 30)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_extract_features_matches_the_full_forward(family):
    model = tiny_target(family)
    ids = torch.randint(2, 128, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    n = model.config.num_hidden_layers
    features = extract_features(model, ids, mask, [0, 2, n - 1, n])
    full = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()  # padded positions are never read (their queries see only themselves)
    for i in (0, 2, n - 1, n):
        torch.testing.assert_close(features[hidden_key(i)][real], full.hidden_states[i][real],
                                   rtol=0, atol=0)
    torch.testing.assert_close(model.lm_head(features[hidden_key(n)])[real], full.logits[real])
    with pytest.raises(DraftsmithError, match="outside"):
        extract_features(model, ids, mask, [n + 1])


@pytest.fixture(scope="module")
def setup():
    model, tokenizer = tiny_target("llama"), char_tokenizer()
    conversations = [
        Conversation(f"c{i}", (
            {"role": "user", "content": f"Tell me about item {i}" + " please" * (i % 5)},
            {"role": "assistant", "content": f"Item {i} is " + "very " * i + "nice."},
        ))
        for i in range(9)
    ]
    samples = render_conversations(tokenizer, conversations, resolve_chat_template(tokenizer), 300)
    return model, tokenizer, samples


def build(setup, folder, **kwargs):
    model, tokenizer, samples = setup
    options = dict(kinds=["eagle3"], dtype="float32", batch_size=3, shard_tokens=400,
                   progress=False)
    return build_feature_cache(model, tokenizer, samples, folder, **(options | kwargs))


def test_cache_round_trip_equals_online_hidden_states(setup, tmp_path):
    model, tokenizer, samples = setup
    report = build(setup, tmp_path)
    assert report.complete and report.shards_written == len(plan_shards(
        [len(s.input_ids) for s in samples], 400)) > 1
    cache = FeatureCache.open(tmp_path, expect=TargetIdentity.of(model, tokenizer),
                              layers=layers_for_kind("eagle3", 4))
    assert cache.layers == (1, 2, 4) and cache.num_samples == len(samples)
    seen = 0
    for batch in cache.iter_batches(4):
        rows = range(seen, seen + batch["input_ids"].shape[0])
        online = extract_features(model, batch["input_ids"], batch["attention_mask"], cache.layers)
        for row, i in enumerate(rows):
            n = len(samples[i].input_ids)
            assert batch["input_ids"][row, :n].tolist() == samples[i].input_ids
            assert batch["loss_mask"][row, :n].tolist() == samples[i].loss_mask
            assert batch["attention_mask"][row].sum() == n
            for key, value in online.items():
                torch.testing.assert_close(batch[key][row, :n], value[row, :n],
                                           rtol=1e-5, atol=1e-5)
        seen += len(rows)
    assert seen == len(samples)
    assert torch.equal(cache.token_counts(), token_counts(samples, 128))


def test_bf16_cache_and_bytes_per_token(setup, tmp_path):
    model = setup[0]
    build(setup, tmp_path, dtype="bfloat16", kinds=["medusa"])
    cache = FeatureCache.open(tmp_path)
    assert cache.layers == (4,)
    assert cache.manifest["bytes_per_token_layout"] == 4 + 4 + 1 + 32 * 2  # ids, choice, mask
    assert cache.manifest["bytes_per_token_layout"] < cache.bytes_per_token < 200
    batch = next(cache.iter_batches(2))
    assert batch[hidden_key(4)].dtype == torch.bfloat16
    online = extract_features(model, batch["input_ids"], batch["attention_mask"], [4])
    n = int(batch["attention_mask"][0].sum())
    torch.testing.assert_close(batch[hidden_key(4)][0, :n].float(),
                               online[hidden_key(4)][0, :n], rtol=1e-2, atol=1e-2)


def test_float8_cache_halves_the_bytes_and_reads_back_within_float8_error(setup, tmp_path):
    model = setup[0]
    build(setup, tmp_path / "f8", dtype="float8_e4m3")
    build(setup, tmp_path / "bf16", dtype="bfloat16")
    f8, bf16 = FeatureCache.open(tmp_path / "f8"), FeatureCache.open(tmp_path / "bf16")
    assert f8.manifest["bytes_per_token_layout"] == 4 + 4 + 1 + 3 * (32 + 4)  # + a row scale
    assert f8.bytes_per_token < 0.75 * bf16.bytes_per_token
    batch = next(f8.iter_batches(2))
    online = extract_features(model, batch["input_ids"], batch["attention_mask"], f8.layers)
    n = int(batch["attention_mask"][0].sum())
    for key in (hidden_key(i) for i in f8.layers):
        assert batch[key].dtype == torch.bfloat16 and not any(k.endswith(".scale") for k in batch)
        exact, read = online[key][0, :n], batch[key][0, :n].float()
        # e4m3 keeps 3 mantissa bits: within 1/16 of each value, or of the row's scale near 0
        bound = exact.abs() / 16 + exact.abs().amax(-1, keepdim=True) / 448 * 2
        assert bool(((read - exact).abs() <= bound).all())
        assert float((read - exact).abs().max()) > 0  # it was stored in float8


def test_float8_shard_without_its_scales_is_reported_damaged(setup, tmp_path):
    from safetensors.torch import load_file, save_file

    build(setup, tmp_path, dtype="float8_e4m3")
    cache = FeatureCache.open(tmp_path)
    first = tmp_path / cache.shards[0]["file"]
    tensors = load_file(first)
    del tensors[f"{hidden_key(cache.layers[0])}.scale"]
    save_file(tensors, first)
    cache.shards[0]["bytes"] = first.stat().st_size  # sizes match: the reader must notice
    with pytest.raises(DraftsmithError, match=r"damaged: shard-00000.safetensors lacks "
                                              r"hidden_states.1.scale"):
        next(cache.iter_samples())


def test_cache_refuses_another_target_or_tokenizer(setup, tmp_path):
    model, tokenizer, _ = setup
    build(setup, tmp_path)
    other_model = tiny_target("qwen2")
    with pytest.raises(DraftsmithError, match=r"made with target .* but the target now is"):
        FeatureCache.open(tmp_path, expect=TargetIdentity.of(other_model, tokenizer))
    other_tokenizer = char_tokenizer()
    other_tokenizer.add_special_tokens({"additional_special_tokens": ["<|eot_id|>"]})
    with pytest.raises(DraftsmithError, match="vocab"):
        FeatureCache.open(tmp_path, expect=TargetIdentity.of(model, other_tokenizer))
    with pytest.raises(DraftsmithError, match=r"holds hidden_states \[1, 2, 4\] but \[3\]"):
        FeatureCache.open(tmp_path, layers=[3])
    with pytest.raises(DraftsmithError, match="not a hidden-state cache"):
        FeatureCache.open(tmp_path / "nowhere")
    with pytest.raises(DraftsmithError, match="other settings"):
        build_feature_cache(other_model, tokenizer, setup[2], tmp_path, kinds=["eagle3"],
                            dtype="float32", shard_tokens=400, progress=False)


def test_interrupted_build_resumes_to_the_same_shards(setup, tmp_path):
    build(setup, tmp_path / "full")
    first = build(setup, tmp_path / "part", stop_after_shards=1)
    assert not first.complete
    (tmp_path / "part" / ".shard-00001.safetensors.tmp").write_bytes(b"partial")
    second = build(setup, tmp_path / "part")
    assert second.complete and second.shards_skipped == 1
    full = sorted((tmp_path / "full").glob("shard-*"))
    part = sorted((tmp_path / "part").glob("shard-*"))
    assert [p.name for p in full] == [p.name for p in part]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(full, part, strict=True))


def test_ranks_and_shuffle_split_the_samples(setup, tmp_path):
    build(setup, tmp_path)
    cache = FeatureCache.open(tmp_path)

    def ids(**kwargs):
        return [tuple(s["input_ids"].tolist()) for s in cache.iter_samples(keys=[], **kwargs)]

    everything = ids()
    rank0, rank1 = ids(world_size=2, rank=0), ids(world_size=2, rank=1)
    assert sorted(rank0 + rank1) == sorted(everything) and not set(rank0) & set(rank1)
    shuffled = ids(shuffle=True, seed=3)
    assert sorted(shuffled) == sorted(everything) and shuffled != everything
    assert shuffled == ids(shuffle=True, seed=3)


def _batches_take(monkeypatch, seconds: float) -> None:
    """A faked clock on which every target forward of the cache takes `seconds`."""
    import draftsmith.data.cache as cache_module

    now = [0.0]
    real = cache_module.extract_features

    def timed(*args, **kwargs):
        now[0] += seconds
        return real(*args, **kwargs)

    monkeypatch.setattr(cache_module, "extract_features", timed)
    monkeypatch.setattr(cache_module.time, "perf_counter", lambda: now[0])


def _batches_per_shard(samples, batch_size: int = 3) -> list[int]:
    from draftsmith.data.batching import plan_batches

    lengths = [len(s.input_ids) for s in samples]
    return [len(plan_batches(lengths[a:b], batch_size, 8192))
            for a, b in plan_shards(lengths, 400)]


def test_time_budget_closes_the_cache_at_the_same_shard_on_every_run(setup, tmp_path, monkeypatch):
    """data.cache.max_minutes: no new shard once the finished ones took the budget (every batch
    takes 1 s; the budget holds two shards and 0.4 s), and a rerun adds none."""
    batches = _batches_per_shard(setup[2])
    assert len(batches) > 2
    _batches_take(monkeypatch, 1.0)
    budget = (batches[0] + batches[1] + 0.4) / 60
    report = build(setup, tmp_path, max_minutes=budget)
    assert report.budget_reached and report.complete and report.shards_written == 2
    cache = FeatureCache.open(tmp_path)
    assert 0 < cache.num_samples < len(setup[2]) and not cache.complete
    assert not any(s.get("partial") for s in cache.shards)
    again = build(setup, tmp_path, max_minutes=budget)
    assert again.budget_reached and again.shards_written == 0


def test_a_budget_shorter_than_a_shard_cuts_it_between_batches(setup, tmp_path, monkeypatch):
    """One shard longer than the whole budget (Qwen2.5-1.5B in float32 on 2 AVX2 cores): the cache
    stops between batches, keeps the samples whose batches ran (their features exact), marks the
    shard partial, and a run with room writes it again whole."""
    model, _, samples = setup
    assert _batches_per_shard(samples, batch_size=1)[0] >= 2
    _batches_take(monkeypatch, 60.0)
    # one sample per batch: the first runs, the next would end 30 s past the 72 s budget
    report = build(setup, tmp_path, max_minutes=1.2, batch_size=1)
    assert report.budget_reached and report.shards_written == 1
    cache = FeatureCache.open(tmp_path)
    (entry,) = cache.shards
    assert entry["partial"] and entry["seconds"] == 60.0 and cache.num_samples == 1
    for sample_id, batch in _cached_samples(tmp_path):
        sample = samples[sample_id]
        assert batch["input_ids"].tolist() == sample.input_ids
        ids = torch.tensor([sample.input_ids])
        online = extract_features(model, ids, torch.ones_like(ids), [2])[hidden_key(2)][0]
        assert torch.allclose(batch[hidden_key(2)], online, atol=1e-5)
    monkeypatch.undo()
    whole = build(setup, tmp_path)
    assert whole.complete and FeatureCache.open(tmp_path).complete
    assert not any(s.get("partial") for s in FeatureCache.open(tmp_path).shards)


def _cached_samples(folder):
    """(sample index, that sample's rows) of every cached sample, read from the shard files."""
    from safetensors.torch import load_file

    for shard in FeatureCache.open(folder).shards:
        tensors = load_file(str(folder / shard["file"]))
        offsets = [0, *tensors["lengths"].cumsum(0).tolist()]
        for row, index in enumerate(tensors["sample_index"].tolist()):
            part = slice(offsets[row], offsets[row + 1])
            yield index, {"input_ids": tensors["input_ids"][part],
                          hidden_key(2): tensors[hidden_key(2)][part].float()}


def test_cache_records_the_targets_choices_and_the_vocab_counts_them(setup, tmp_path):
    """target_argmax is the target's greedy choice after every token (its full forward's argmax);
    the draft vocabulary counts it where the next token is trained, per sample."""
    from safetensors import safe_open

    from draftsmith.draft_vocab.counting import target_choice_counts

    model, _, samples = setup
    build(setup, tmp_path)
    expected = torch.zeros(model.config.vocab_size, dtype=torch.int64)
    for sample in samples:
        ids = torch.tensor([sample.input_ids])
        with torch.no_grad():
            choice = model(ids).logits[0].argmax(-1)
        trained_next = torch.tensor([*sample.loss_mask[1:], 0]).bool()
        expected += torch.bincount(choice[trained_next], minlength=model.config.vocab_size)
    cache = FeatureCache.open(tmp_path)
    first = cache.shards[0]
    with safe_open(tmp_path / first["file"], framework="pt") as handle:
        assert handle.get_tensor("target_argmax").dtype == torch.int32
    shards = [tmp_path / shard["file"] for shard in cache.shards]
    assert torch.equal(target_choice_counts(shards, model.config.vocab_size), expected)
