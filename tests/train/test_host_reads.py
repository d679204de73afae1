"""The training step never waits on the host: one drafter forward + loss + backward of every
registered kind reads no scalar from its tensors and selects no rows by a data-dependent count.

A `TorchDispatchMode` sees every aten call and counts the ones that make the host wait for the
device: `_local_scalar_dense` (what `.item()`, `int()`, `bool()` and `float()` of a tensor run),
`nonzero`, `masked_select`, `item`, and indexing (`index`, `index_put_`) with a boolean mask,
whose output size is the mask's count. On a GPU each one stalls the stream; on this CPU they cost
little, which is why the count is held here rather than timed.

The target's forward (`target_features`) runs before counting: it is the target's, not the
drafter's; so does the count of the trained positions, which the collate makes on the host
before the batch reaches the device (`NEXT_TRAINED_KEY`), and a kind's own rows whose sizes
depend on the data (P-EAGLE's COD draw, registry `collate_rows`). The training loop's own reads
are counted by the loop's tests.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from draftsmith.models.features import target_features
from draftsmith.models.layers import next_trained_rows
from draftsmith.registry import get_spec
from tests.helpers.drafters import small_settings, training_cases
from tests.helpers.tiny_targets import tiny_target

aten = torch.ops.aten
SCALAR_READS = {aten._local_scalar_dense.default, aten.item.default, aten.nonzero.default,
                aten.masked_select.default}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
            aten._index_put_impl_.default}


def _boolean_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in indices or ())


class HostReads(TorchDispatchMode):
    """Counts the aten calls that read the host (by name) while active."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SCALAR_READS or (func in INDEXING and _boolean_index(args)):
            self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _batch(seed=0, b=2, t=24):
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, 128, (b, t), generator=gen)
    attention_mask = torch.ones(b, t, dtype=torch.long)
    attention_mask[1, -5:] = 0  # right padding in the second row
    loss_mask = attention_mask.clone()
    loss_mask[:, :6] = 0  # a prompt
    return input_ids, attention_mask, loss_mask


def _cases():
    extra = [pytest.param("eagle3", {**small_settings("eagle3"), "position_weights": "dpace",
                                     "loss": {"ce": 0.2, "lk": 0.8}}, id="eagle3-dpace-mixed"),
             pytest.param("mtp", {**small_settings("mtp"), "labels": "data"}, id="mtp-data"),
             pytest.param("medusa", {**small_settings("medusa"), "position_weights": "dpace"},
                          id="medusa-dpace")]
    return [*training_cases(), *extra]


def _with_cached_argmax():
    """Every case online, and the read-free kinds with a draft vocabulary also with the cache's
    stored argmax (their teacher then takes another path)."""
    cases = []
    for case in _cases():
        kind, settings = case.values
        cases.append(pytest.param(kind, settings, False, id=f"{case.id}-online", marks=case.marks))
        if get_spec(kind).uses_draft_vocab:
            cases.append(pytest.param(kind, settings, True, id=f"{case.id}-cached-argmax",
                                      marks=case.marks))
    return cases


@pytest.mark.parametrize("kind, settings, cached_argmax", _with_cached_argmax())
def test_a_drafter_step_reads_nothing_from_the_host(kind, settings, cached_argmax):
    target = tiny_target("llama")
    spec = get_spec(kind)
    config = spec.make_config(settings)
    torch.manual_seed(0)
    drafter = spec.build(target.config, config)
    drafter.init_from_target(target)
    input_ids, attention_mask, loss_mask = _batch()
    # the trained positions as the collate counts them, on the host (train/batching.py)
    # and a kind's own rows as its collate draws them (P-EAGLE's COD draw)
    rows = spec.collate_rows(config, 0, input_ids, attention_mask, loss_mask) \
        if spec.collate_rows else None
    features = target_features(target, input_ids, attention_mask, loss_mask,
                               spec.aux_layers(target.config.num_hidden_layers, config),
                               next_trained_rows(loss_mask), rows)
    if cached_argmax:  # the offline cache's stored choice (data/cache.py)
        features.target_argmax = features.target_logits.argmax(-1)
        del features.__dict__["target_logits"]
    with HostReads() as reads:
        loss, metrics = spec.loss(drafter, features)
        loss.backward()
    assert sum(reads.counts.values()) == 0, \
        f"{kind}: host reads in the drafter's step: {dict(reads.counts)}"
    assert torch.isfinite(loss) and all(isinstance(v, torch.Tensor) for v in metrics.values())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in drafter.parameters())
