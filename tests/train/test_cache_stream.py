"""Offline training streams the hidden-state cache: each rank its own shards (disjoint, every
training sample once per epoch over the ranks, the same number of batches on each), the held-out
set the same on every rank, resume by skipping batches without reading them, at most `window`
shards open at once, and a killed offline run resumes to the same weights as a straight one."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.data.cache import build_feature_cache
from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.render import RenderedSample
from draftsmith.errors import DraftsmithError
from draftsmith.models.target_states import hidden_key
from draftsmith.train.cache_stream import CacheStream, held_out
from draftsmith.train.loader import to_device
from draftsmith.train.loop import run_training
from draftsmith.train.recipe import build_recipe
from tests.helpers.state import killed_at_step, reset_accelerate
from tests.helpers.tiny_targets import tiny_target


class Tokenizer:
    """Just enough of a tokenizer for the cache's identity check."""

    def get_vocab(self):
        return {f"t{i}": i for i in range(128)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """`tiny_cache`'s."""
    return tiny_cache(tmp_path_factory.mktemp("cache"))


def tiny_cache(folder) -> FeatureCache:
    """40 samples of 9..16 tokens in shards of ~48 tokens (11 shards) in `folder`; the first
    token of each sample is its number, so a batch says which samples it holds."""
    target = tiny_target("llama")
    gen = torch.Generator().manual_seed(0)
    samples = []
    for i in range(40):
        length = 9 + i % 8
        ids = [i + 2, *torch.randint(2, 128, (length - 1,), generator=gen).tolist()]
        samples.append(RenderedSample(ids, [0] * 3 + [1] * (length - 3), str(i)))
    build_feature_cache(target, Tokenizer(), samples, folder, kinds=["eagle3"], dtype="float32",
                        shard_tokens=48, progress=False)
    return FeatureCache.open(folder)


def stream(cache, rank=0, world_size=1, window=2, batch_size=3, eval_fraction=0.2,
           max_held=None, batching="rows", batch_tokens=None):
    return CacheStream(cache, [hidden_key(i) for i in cache.layers], ("target_argmax",),
                       batch_size=batch_size, max_length=64, seed=7,
                       eval_fraction=eval_fraction, rank=rank, world_size=world_size,
                       max_held=max_held, window=window, batching=batching,
                       batch_tokens=batch_tokens)


def ids_of(batches):
    return [int(b["input_ids"][r, 0]) - 2 for b in batches for r in range(b["input_ids"].shape[0])]


def test_ranks_stream_disjoint_shards_and_share_the_held_out_set(cache):
    assert len(cache.shards) > 4
    one = stream(cache)
    ranks = [stream(cache, rank=r, world_size=2) for r in range(2)]
    held = set(ids_of(one.eval_batches()))
    assert 0 < len(held) < 40 and one.num_held_out == len(held)
    seen = [ids_of(r.train_batches(0)) for r in ranks]
    assert len(seen[0]) == len(seen[1]) == ranks[0].epoch_length(0) * 3  # ranks stay in step
    assert not set(seen[0]) & set(seen[1]) and not (set(seen[0]) | set(seen[1])) & held
    everything = ids_of(one.train_batches(0))
    assert len(set(everything)) == len(everything) == one.epoch_length(0) * 3
    assert set(everything) <= set(range(40)) - held
    shares = [ids_of(r.eval_batches()) for r in ranks]
    # the same number of held-out samples per rank (each forward is a collective under a
    # sharded target): an odd one out is left out
    assert len(shares[0]) == len(shares[1]) == len(held) // 2
    assert not set(shares[0]) & set(shares[1]) and set(shares[0]) | set(shares[1]) <= held
    assert [len(list(r.eval_batches())) for r in ranks] == [r.num_eval_batches() for r in ranks]
    assert ids_of(one.train_batches(1)) != everything  # a new order each epoch
    assert ids_of(stream(cache).train_batches(0)) == everything  # the same for the same epoch


def test_token_batches_hold_every_sample_within_the_budget_and_ranks_stay_in_step(cache):
    one = stream(cache, batching="tokens", batch_tokens=64)
    held = set(ids_of(one.eval_batches()))
    batches = list(one.train_batches(0))
    assert len(batches) == one.epoch_length(0)
    everything = ids_of(batches)
    assert sorted(everything) == sorted(set(range(40)) - held)  # each training sample once
    assert all(b["input_ids"].numel() <= 64 or b["input_ids"].shape[0] == 1 for b in batches)
    assert any(b["input_ids"].shape[0] > 4 for b in batches)  # short rows: more of them
    assert ids_of(stream(cache, batching="tokens", batch_tokens=64).train_batches(0)) == \
        everything and ids_of(one.train_batches(1)) != everything
    ranks = [stream(cache, rank=r, world_size=2, batching="tokens", batch_tokens=64)
             for r in range(2)]
    lengths = [len(list(r.train_batches(0))) for r in ranks]
    assert lengths[0] == lengths[1] == ranks[0].epoch_length(0) == ranks[1].epoch_length(0)
    for skip in (0, 1, lengths[0]):
        resumed = list(ranks[1].train_batches(0, skip))
        assert ids_of(resumed) == ids_of(list(ranks[1].train_batches(0))[skip:])


def test_float8_rows_reach_the_device_as_stored_and_are_dequantised_there(tmp_path):
    samples = [RenderedSample(list(range(2, 2 + n)), [0] * 3 + [1] * (n - 3), str(n))
               for n in (9, 12, 14, 10)]
    build_feature_cache(tiny_target("llama"), Tokenizer(), samples, tmp_path, kinds=["eagle3"],
                        dtype="float8_e4m3", shard_tokens=1000, progress=False)
    s = stream(FeatureCache.open(tmp_path), batch_size=2, eval_fraction=0.0, window=1)
    for host, raw in zip(s.train_batches(0), s.train_batches(0, float8=True), strict=True):
        key = hidden_key(s.cache.layers[-1])
        assert raw[key].dtype == torch.float8_e4m3fn and host[key].dtype == torch.bfloat16
        fed = to_device(raw, torch.device("cpu"))
        assert fed.keys() == host.keys() and all(torch.equal(fed[k], host[k]) for k in host)


def test_resume_skips_batches_exactly_and_a_window_bounds_the_open_shards(cache, monkeypatch):
    s = stream(cache, window=2)
    full = list(s.train_batches(1))
    for skip in (0, 1, 4, len(full) - 1, len(full)):
        resumed = list(s.train_batches(1, skip))
        assert len(resumed) == len(full) - skip
        for a, b in zip(resumed, full[skip:], strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opened, most = [0], [0]
    original = FeatureCache.read_shard

    def counting(self, *args):
        context = original(self, *args)

        class Counted:
            def __enter__(self):
                opened[0] += 1
                most[0] = max(most[0], opened[0])
                return context.__enter__()

            def __exit__(self, *exc):
                opened[0] -= 1
                return context.__exit__(*exc)

        return Counted()

    monkeypatch.setattr(FeatureCache, "read_shard", counting)
    list(s.train_batches(0))
    assert most[0] == 2 and opened[0] == 0


def test_held_out_is_a_fraction_of_positions_and_errors_name_the_fix(cache):
    chosen = held_out(torch.arange(100_000), seed=3, fraction=0.05)
    assert 0.045 < float(chosen.float().mean()) < 0.055
    assert torch.equal(chosen, held_out(torch.arange(100_000), seed=3, fraction=0.05))
    assert stream(cache, eval_fraction=1e-6).num_held_out == 1  # at least one when asked
    with pytest.raises(DraftsmithError, match="shard_tokens, or train on fewer processes"):
        stream(cache, world_size=len(cache.shards) + 1)
    with pytest.raises(DraftsmithError, match=r"lower train\.batch_size"):
        stream(cache, batch_size=40)


def test_a_held_out_cap_keeps_the_first_held_samples_and_trains_on_the_rest(cache):
    whole, capped = stream(cache, eval_fraction=0.5), stream(cache, eval_fraction=0.5, max_held=2)
    assert whole.num_held_out > 2 and capped.num_held_out == 2
    assert capped.num_train == whole.num_train + whole.num_held_out - 2
    held = [(k, i) for k, s in enumerate(whole.shards) for i in s.held]
    assert [(k, i) for k, s in enumerate(capped.shards) for i in s.held] == held[:2]
    for k, shard in enumerate(capped.shards):  # every sample once, in order
        assert sorted(shard.train + shard.held) == sorted(whole.shards[k].train +
                                                          whole.shards[k].held)
        assert shard.train == sorted(shard.train)


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_a_killed_offline_run_resumes_to_the_same_weights(cache, tmp_path, monkeypatch):
    target = tiny_target("llama")

    def recipe(name, **train):
        return build_recipe({"drafter": {"kind": "eagle3", "draft_vocab_size": 128,
                                         "ttt_steps": 2},
                             "train": {"batch_size": 4, "max_steps": 10, "warmup_steps": 1,
                                       "lr": 1e-3, "eval_fraction": 0.2, "cache_window": 2,
                                       "mixed_precision": "no", "features": "offline",
                                       "output_dir": str(tmp_path / name), **train}})

    def fresh_stream(r):
        return stream(cache, window=r.train.cache_window, batch_size=r.train.batch_size,
                      batching=r.train.batching, batch_tokens=r.train.token_budget)

    straight_recipe = recipe("a")
    straight = run_training(straight_recipe, fresh_stream(straight_recipe), target=target)
    reset_accelerate()
    # saved past the first epoch's batches: the saved position is in epoch 1
    killed = recipe("b", save_every=9)
    killed_at_step(monkeypatch, 10, run_training, killed, fresh_stream(killed), target=target)
    progress = json.loads((tmp_path / "b" / "checkpoints" / "step_9" / "progress.json")
                          .read_text())
    lengths = [fresh_stream(killed).epoch_length(e) for e in range(2)]
    assert lengths[0] < 9 < sum(lengths)
    assert progress["data_stream"] == {"epoch": 1, "batches_done": 9 - lengths[0]}
    resumed = run_training(killed, fresh_stream(killed), target=target)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
