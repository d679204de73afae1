"""Packed batches (train/packing.py): the plan covers every sequence once within the row length,
the collate lays out documents and their positions, and a packed EAGLE-3 step computes the loss
and gradients of the same conversations in their own rows (float64, the target run online, and
from cached features)."""

from __future__ import annotations

import random

import pytest
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.models.features import cached_features, target_features
from draftsmith.models.masks import document_causal_mask
from draftsmith.models.target_states import hidden_key
from draftsmith.registry import DRAFTERS, get_spec
from draftsmith.train.batching import collate
from draftsmith.train.packing import collate_packed, pack_rows, packed_batches, packing_share
from draftsmith.train.recipe import build_recipe
from tests.helpers.tiny_targets import tiny_target
from tests.train.test_cache_stream import ids_of, stream, tiny_cache

LENGTHS = (9, 14, 6, 11)


def _examples(seed: int = 0) -> list[dict]:
    """Conversations of LENGTHS tokens; the second trains from its first token on (a label
    crossing into it from a packed neighbour would show), the others from their third."""
    rng = torch.Generator().manual_seed(seed)
    examples = []
    for n, length in enumerate(LENGTHS):
        mask = [0, 0] + [1] * (length - 2) if n != 1 else [1] * length
        examples.append({"input_ids": torch.randint(2, 128, (length,), generator=rng).tolist(),
                         "loss_mask": mask})
    return examples


def test_pack_rows_places_every_sequence_once_within_the_row():
    lengths = [random.Random(i).randint(1, 50) for i in range(200)]
    rows = pack_rows(lengths, 64, 50, random.Random(0))
    assert sorted(i for row in rows for i in row) == list(range(200))
    assert all(sum(lengths[i] for i in row) <= 64 for row in rows)
    assert rows == pack_rows(lengths, 64, 50, random.Random(0))  # a function of the seed
    batches = packed_batches(lengths, 64, 4, 200, random.Random(0))
    assert all(len(b) <= 4 for b in batches)
    assert packing_share(lengths, batches) < 0.1  # first-fit decreasing fills the rows


def test_collate_lays_out_documents_positions_and_masks():
    examples = _examples()
    batch = collate_packed([[examples[0], examples[1]], [examples[2]]], max_length=64)
    assert batch["input_ids"].shape == (2, 23)
    assert batch["document_ids"][0].tolist() == [1] * 9 + [2] * 14
    assert batch["document_ids"][1].tolist() == [1] * 6 + [0] * 17
    assert batch["position_ids"][0].tolist() == list(range(9)) + list(range(14))
    assert batch["attention_mask"].sum() == 29
    assert batch["loss_mask"][0, 9] == 0 and batch["loss_mask"][0, 10] == 1  # a first token
    mask = document_causal_mask(batch["document_ids"])[0, 0]
    assert mask[10, 9] and not mask[10, 8]  # its own document's keys, none of the one before
    assert mask[8, 0] and not mask[8, 9] and mask[15, 15] and not mask[15, 16]  # causal


def _step(drafter, spec, features):
    drafter.zero_grad(set_to_none=True)
    loss, metrics = spec.loss(drafter, features)
    loss.backward()
    return loss.detach(), metrics, {n: p.grad.clone() for n, p in drafter.named_parameters()
                                    if p.grad is not None}


PACKING = [k for k, spec in DRAFTERS.items() if spec.packs]
# EAGLE-1's feature noise draws by the batch's shape: off, so both layouts train the same
SETTINGS = {"eagle3": {"draft_vocab_size": 96, "ttt_steps": 3}, "eagle1": {"feature_noise": 0.0},
            "medusa": {"num_heads": 3}, "mtp": {"num_modules": 3},
            "peagle": {"draft_vocab_size": 96, "num_depths": 3, "cod_ratio": 0.7},
            "dflash": {"block_size": 4, "num_layers": 1, "anchors_per_sequence": 5},
            "dspark": {"block_size": 3, "num_layers": 1, "anchors_per_sequence": 5,
                       "markov_rank": 8}}
PACKED = [[0, 1, 3], [2]]  # the examples of each packed row


def _layouts(rows=None) -> dict[str, dict]:
    """The four conversations one per row, and packed in two rows (three, then one)."""
    examples = _examples()
    return {"unpacked": collate(examples, 64, rows),
            "packed": collate_packed([[examples[i] for i in row] for row in PACKED], 64, rows)}


def _moved(unpacked: dict, packed: dict) -> dict[int, int]:
    """Unpacked flat position -> packed flat position of the same token."""
    t, (_, t_packed) = unpacked["input_ids"].shape[1], packed["input_ids"].shape
    where = {}
    for row, examples in enumerate(PACKED):
        start = 0
        for example in examples:
            n = int(unpacked["attention_mask"][example].sum())
            for i in range(n):
                where[example * t + i] = row * t_packed + start + i
            start += n
    return where


def _same_blocks(unpacked: dict, packed: dict, proposals: int) -> None:
    """Give the packed batch the block drafters' anchors of the unpacked one, each moved to where
    its token sits in the packed rows."""
    from draftsmith.models.block_loss import plan_blocks

    where, t = _moved(unpacked, packed), unpacked["input_ids"].shape[1]
    t_packed = packed["input_ids"].shape[1]
    valid = unpacked["kind_rows.trained"][..., 0]  # a drawn anchor trains its first proposal
    rows = [sorted(where[e * t + int(a)] - r * t_packed for e in examples
                   for a, ok in zip(unpacked["kind_rows.anchors"][e], valid[e], strict=True) if ok)
            for r, examples in enumerate(PACKED)]
    n = max(map(len, rows))
    anchors = torch.tensor([row + [row[-1]] * (n - len(row)) for row in rows])
    ok = torch.tensor([[True] * len(row) + [False] * (n - len(row)) for row in rows])
    plan = plan_blocks(packed["loss_mask"], anchors, ok, proposals, packed["document_ids"])
    packed.update({f"kind_rows.{k}": v for k, v in plan.items()})


def _same_draw(unpacked: dict, packed: dict) -> None:
    """Give the packed batch P-EAGLE's COD draw of the unpacked one, each anchor moved to where
    its token sits in the packed rows (the draws of two layouts differ)."""
    from draftsmith.models.peagle import cod_rows

    where = _moved(unpacked, packed)
    depths = sum(1 for k in unpacked if k.startswith("kind_rows.anchors."))
    anchors = []
    for d in range(depths):
        moved = torch.zeros(packed["input_ids"].numel(), dtype=torch.bool)
        moved[[where[int(a)] for a in unpacked[f"kind_rows.anchors.{d}"]]] = True
        anchors.append(moved.view_as(packed["input_ids"]))
    packed.update({f"kind_rows.{k}": v for k, v in
                   cod_rows(packed["attention_mask"], anchors).items()})


def _assert_same(results: dict, close: dict) -> None:
    (loss, metrics, grads), (plain_loss, plain_metrics, plain_grads) = \
        results["packed"], results["unpacked"]
    torch.testing.assert_close(loss, plain_loss, **close)
    for key in plain_metrics:
        torch.testing.assert_close(metrics[key], plain_metrics[key], **close,
                                   msg=lambda m, key=key: f"{key}: {m}")
    assert grads.keys() == plain_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], **close, msg=f"gradient of {name}")


@pytest.mark.parametrize("features_from", ["online", "offline"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", PACKING)
def test_a_packed_step_equals_the_unpacked_one(kind, attention, features_from):
    target = tiny_target("llama", attn_implementation=attention).double()
    spec = get_spec(kind)
    config = spec.make_config(SETTINGS[kind])
    torch.manual_seed(0)
    drafter = spec.build(target.config, config).double()
    drafter.init_from_target(target)
    aux = spec.aux_layers(target.config.num_hidden_layers, config)
    rows = (lambda *a, **k: spec.collate_rows(config, 0, *a, **k)) if spec.collate_rows else None
    results, layouts = {}, _layouts(rows)
    if kind == "peagle":
        _same_draw(layouts["unpacked"], layouts["packed"])
    if kind in ("dflash", "dspark"):
        _same_blocks(layouts["unpacked"], layouts["packed"], drafter.proposals)
    for name, batch in layouts.items():
        online = target_features(target, batch["input_ids"], batch["attention_mask"],
                                 batch["loss_mask"], aux, batch["next_trained"],
                                 {k[len("kind_rows."):]: v for k, v in batch.items()
                                  if k.startswith("kind_rows.")},
                                 batch.get("document_ids"), batch.get("position_ids"))
        if features_from == "offline":  # the cache's per-token states, laid out as the collate
            keys = [hidden_key(i + 1) for i in aux] + [hidden_key(4)]
            states = dict(zip(keys, [*online.aux_hidden, online.last_hidden], strict=True))
            features = cached_features({**batch, **states}, target.get_output_embeddings(),
                                       aux, 4)
        else:
            features = online
        results[name] = _step(drafter, spec, features)
    # transformers' eager attention takes its softmax in float32, and the block drafters their
    # logits: equal to that rounding there
    exact = attention == "sdpa" and kind not in ("dflash", "dspark")
    _assert_same(results, dict(rtol=1e-10, atol=1e-12) if exact else dict(rtol=1e-5, atol=1e-8))


def test_a_packed_medusa2_step_equals_the_unpacked_one():
    from draftsmith.train.joint import medusa2_loss, wrap_with_lora

    target = tiny_target("llama").double()
    spec = get_spec("medusa")
    config = spec.make_config({"num_heads": 2, "lora": True})
    torch.manual_seed(0)
    heads = spec.build(target.config, config).double()
    heads.init_from_target(target)
    joint = wrap_with_lora(target, config).double()
    for parameter in joint.parameters():  # LoRA's B starts at zero: give the adapters a say
        if parameter.requires_grad:
            parameter.data.normal_(0, 0.05)
    results = {}
    for name, batch in _layouts().items():
        heads.zero_grad(set_to_none=True)
        joint.zero_grad(set_to_none=True)
        loss, metrics = medusa2_loss(heads, joint, batch)
        loss.backward()
        grads = {n: p.grad.clone() for module in (heads, joint)
                 for n, p in module.named_parameters() if p.grad is not None}
        results[name] = (loss.detach(), metrics, grads)
    _assert_same(results, dict(rtol=1e-10, atol=1e-12))


def test_the_packed_target_states_equal_each_conversation_alone():
    target = tiny_target("qwen2").double()
    examples = _examples()
    batch = collate_packed([examples[:3]], 64)
    packed = target_features(target, batch["input_ids"], batch["attention_mask"],
                             batch["loss_mask"], [1], None, None, batch["document_ids"],
                             batch["position_ids"])
    start = 0
    for example in examples[:3]:
        alone = target(torch.tensor([example["input_ids"]]), output_hidden_states=True)
        n = len(example["input_ids"])
        torch.testing.assert_close(packed.last_hidden[0, start:start + n],
                                   alone.hidden_states[-1][0], rtol=1e-10, atol=1e-10)
        start += n


def test_every_kind_packs_and_a_kind_that_cannot_is_refused_by_name(monkeypatch):
    from dataclasses import replace

    import draftsmith.registry as registry

    assert [k for k, s in DRAFTERS.items() if s.packs] == list(DRAFTERS)
    recipe = build_recipe({"target": {"name": "smollm2-135m-instruct"},
                           "drafter": {"kind": "eagle3"}, "train": {"batching": "packed"}})
    assert recipe.train.batching == "packed"
    monkeypatch.setitem(registry.DRAFTERS, "mtp", replace(DRAFTERS["mtp"], packs=False))
    with pytest.raises(DraftsmithError, match=r"train.batching=packed: the mtp loss does not "
                                              r"yet keep.*use train.batching: tokens"):
        build_recipe({"target": {"name": "smollm2-135m-instruct"},
                      "drafter": {"kind": "mtp"}, "train": {"batching": "packed"}})


def test_a_target_attention_without_a_4d_mask_is_refused_for_packed_rows():
    from draftsmith.models.target_states import decoder_mask

    target = tiny_target("llama")
    batch = collate_packed([_examples()[:2]], 64)
    target.config._attn_implementation = "flash_attention_2"
    with pytest.raises(DraftsmithError, match=r"'flash_attention_2'.*load the target with sdpa"):
        decoder_mask(target, batch["attention_mask"], batch["document_ids"])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tiny_cache(tmp_path_factory.mktemp("cache"))


def documents_of(batches) -> list[tuple]:
    """Each document of packed batches, as its real tokens, batch by batch."""
    found = []
    for b in batches:
        for ids, docs in zip(b["input_ids"], b["document_ids"], strict=True):
            found += [tuple(ids[docs == d].tolist()) for d in range(1, int(docs.max()) + 1)]
    return found


def test_in_memory_packed_batches_hold_every_example_once_split_and_resume():
    from tests.train.test_batching import batches_of, example_rows

    data = example_rows()
    one = batches_of(data, batching="packed", batch_tokens=32)  # 2 rows of 16 a batch
    batches = list(one.train_batches(0))
    assert len(batches) == one.epoch_length(0)
    assert all(b["input_ids"].shape[0] <= 2 and b["input_ids"].shape[1] <= 16 for b in batches)
    assert sorted(documents_of(batches)) == sorted(tuple(e["input_ids"][:16])
                                                   for e in one.train_set)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    assert real / sum(b["input_ids"].numel() for b in batches) > 0.9
    assert documents_of(one.train_batches(0, 2)) == documents_of(batches[2:])
    fed = batches_of(data, batching="packed", batch_tokens=32, loader_workers=1)
    assert documents_of(fed.train_batches(0)) == documents_of(batches)  # a worker process
    ranks = [batches_of(data, world=2, rank=r, batching="packed", batch_tokens=32)
             for r in range(2)]
    wide = list(batches_of(data, batching="packed", batch_tokens=64).train_batches(0))
    for whole, first, second in zip(wide, *(r.train_batches(0) for r in ranks), strict=True):
        assert torch.equal(first["input_ids"], whole["input_ids"][0::2, :first["input_ids"]
                                                                     .shape[1]])
        assert torch.equal(second["document_ids"], whole["document_ids"][1::2, :second[
            "document_ids"].shape[1]])


def test_the_cache_streams_packed_batches_of_every_training_sample(cache):
    one = stream(cache, batching="packed", batch_tokens=128)  # 2 rows of 64
    held = set(ids_of(one.eval_batches()))
    batches = list(one.train_batches(0))
    assert len(batches) == one.epoch_length(0)
    firsts = sorted(d[0] - 2 for d in documents_of(batches))
    assert firsts == sorted(set(range(40)) - held)
    assert all(b["input_ids"].shape[0] <= 2 for b in batches)
    assert documents_of(one.train_batches(0, 1)) == documents_of(batches[1:])
    # every document's cached states and target choices are its own, where its tokens are
    alone = {}
    for b in stream(cache, batching="rows").train_batches(0):
        for r in range(b["input_ids"].shape[0]):
            n = int(b["attention_mask"][r].sum())
            alone[int(b["input_ids"][r, 0])] = {k: b[k][r, :n] for k in
                                                ("hidden_states.4", "hidden_states.2",
                                                 "target_argmax", "loss_mask")}
    checked = 0
    for b in batches:
        for r in range(b["input_ids"].shape[0]):
            for d in range(1, int(b["document_ids"][r].max()) + 1):
                at = b["document_ids"][r] == d
                mine = alone[int(b["input_ids"][r][at][0])]
                for key in ("hidden_states.4", "hidden_states.2", "target_argmax"):
                    assert torch.equal(b[key][r][at], mine[key]), key
                assert torch.equal(b["loss_mask"][r][at][1:], mine["loss_mask"][1:])
                assert b["loss_mask"][r][at][0] == 0 and b["position_ids"][r][at][0] == 0
                checked += 1
    assert checked == len(firsts)


@pytest.mark.usefixtures("fresh_accelerate_state")
@pytest.mark.parametrize("features", ["online", "offline"])
def test_eagle3_trains_on_packed_batches(features, cache, tmp_path):
    import json

    from draftsmith.train.loop import run_training
    from tests.train.test_loop import examples

    target = tiny_target("llama")
    recipe = build_recipe({"drafter": {"kind": "eagle3", "draft_vocab_size": 128,
                                       "ttt_steps": 2},
                           "train": {"batch_size": 2, "max_length": 64, "max_steps": 4,
                                     "warmup_steps": 1, "lr": 1e-3, "eval_fraction": 0.2,
                                     "batching": "packed", "mixed_precision": "no",
                                     "features": features, "output_dir": str(tmp_path)}})
    data = examples() if features == "online" else stream(
        cache, batch_size=2, batching="packed", batch_tokens=recipe.train.token_budget)
    out = run_training(recipe, data, target=target)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert max(r["tokens"] for r in steps) > 64  # rows of 64 holding several conversations
    assert (out / "model.safetensors").is_file()


def test_the_cod_draw_of_packed_rows_counts_each_document_as_a_sequence():
    from draftsmith.models.peagle import cod_anchors
    from draftsmith.models.ttt_rows import label_valid

    examples = _examples()
    batch = collate_packed([examples], 64)
    valid = label_valid(batch["loss_mask"], 3, batch["document_ids"])
    anchors = cod_anchors(valid, 0.5, 0.1, torch.Generator().manual_seed(0),
                          batch["document_ids"])
    documents = batch["document_ids"][0]
    for d in range(1, 3):
        assert not (anchors[d] & ~anchors[d - 1]).any()  # each set holds the next
        for doc in range(1, len(examples) + 1):
            seeds = int(valid[0][0][documents == doc].sum())
            expected = int((max(seeds - d, 0)) * max(0.5 ** d, 0.1))
            eligible = int((anchors[d - 1] & valid[d])[0][documents == doc].sum())
            assert int(anchors[d][0][documents == doc].sum()) == min(expected, eligible)


@pytest.mark.parametrize("seed", range(5))
def test_block_anchors_of_packed_rows_are_drawn_per_document(seed):
    from draftsmith.models.block_loss import block_plan

    examples = _examples()
    # rows of unequal documents: a row that keeps fewer anchors is filled with invalid ones
    batch = collate_packed([examples[:3], examples[3:]], 64)
    documents = batch["document_ids"]
    plan = block_plan(batch["loss_mask"], batch["attention_mask"], 3, 2,
                      torch.Generator().manual_seed(seed), documents)
    for row in range(2):
        anchors, valid = plan["anchors"][row], plan["trained"][row, :, 0]
        drawn = anchors[valid]
        assert drawn.tolist() == sorted(drawn.tolist())
        for doc in range(1, int(documents[row].max()) + 1):
            mine = drawn[documents[row, drawn] == doc]
            assert 0 < len(mine) <= 3  # up to anchors_per_sequence in every document
            assert (documents[row, mine + 1] == doc).all()  # its next token is its document's
        starts = plan["starts"][row][valid]
        assert (documents[row, starts] == documents[row, drawn]).all()
        assert ((starts == 0) | (documents[row, (starts - 1).clamp_min(0)] !=
                                 documents[row, starts])).all()  # where the document starts


@pytest.mark.parametrize("kind", PACKING)
def test_a_packed_drafter_step_reads_nothing_from_the_host(kind):
    from tests.train.test_host_reads import HostReads

    target = tiny_target("llama")
    spec = get_spec(kind)
    config = spec.make_config(SETTINGS[kind])
    torch.manual_seed(0)
    drafter = spec.build(target.config, config)
    drafter.init_from_target(target)
    rows = (lambda *a, **k: spec.collate_rows(config, 0, *a, **k)) if spec.collate_rows else None
    batch = _layouts(rows)["packed"]  # the collate's work, on the host
    features = target_features(target, batch["input_ids"], batch["attention_mask"],
                               batch["loss_mask"],
                               spec.aux_layers(target.config.num_hidden_layers, config),
                               batch["next_trained"],
                               {k[len("kind_rows."):]: v for k, v in batch.items()
                                if k.startswith("kind_rows.")},
                               batch["document_ids"], batch["position_ids"])
    with HostReads() as reads:
        loss, _ = spec.loss(drafter, features)
        loss.backward()
    assert sum(reads.counts.values()) == 0, f"{kind}: host reads: {dict(reads.counts)}"
    assert torch.isfinite(loss)
