"""Run by tests/train/test_fsdp.py under a 2-process launch: the target `load_sharded_target`
shards has exactly one FSDP root, the model itself, before and after it runs as training runs it
(its decoder, then its output head on its own), every unit under that root, each decoder layer's
all-gather prefetched by the unit before it; and its features equal the whole model's. Prints
`ok` on rank 0."""

from __future__ import annotations

import itertools
import os
import sys

import torch
from accelerate import Accelerator
from torch.distributed.fsdp import FSDPModule
from transformers import AutoModelForCausalLM

from draftsmith.models.features import target_features
from draftsmith.target.load import TargetSpec
from draftsmith.train.target_parts import load_sharded_target


def fsdp_states(model: torch.nn.Module) -> dict[str, object]:
    """{module name: its FSDP state} for every FSDP2 unit in `model` (the model itself is "")."""
    return {name: module._get_fsdp_state() for name, module in model.named_modules()
            if isinstance(module, FSDPModule)}


def assert_one_root(model: torch.nn.Module) -> None:
    states = fsdp_states(model)
    roots = [name for name, state in states.items() if state._is_root]
    assert roots == [""], f"FSDP roots {roots}: the target itself must be the only one"
    unset = [name for name, state in states.items() if state._is_root is None]
    assert not unset, f"units not initialised under the root: {unset}"
    shared = {id(state._comm_ctx) for state in states.values()}
    assert len(shared) == 1, "every unit shares the root's all-gather streams"


def main(folder: str) -> None:
    accelerator = Accelerator(cpu=True)
    whole = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    sharded = load_sharded_target(TargetSpec(name=folder, dtype="float32"),
                                  str(accelerator.device)).model
    assert_one_root(sharded)
    layers = sharded.get_decoder().layers
    assert len(fsdp_states(sharded)) == len(layers) + 4  # layers, embed, norm, head, the root
    order = [sharded.get_input_embeddings(), *layers]
    for unit, following in itertools.pairwise(order):
        prefetched = unit._get_fsdp_state()._states_to_forward_prefetch
        assert prefetched == [following._get_fsdp_state()], "each layer's all-gather prefetched"

    gen = torch.Generator().manual_seed(accelerator.process_index)  # other data on each rank
    ids = torch.randint(2, 128, (2, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # right padding, as training batches are
    aux = [0, 1]
    got = target_features(sharded, ids, mask, mask, aux)
    want = target_features(whole, ids, mask, mask, aux)
    torch.testing.assert_close(got.last_hidden, want.last_hidden, rtol=1e-6, atol=1e-6)
    for a, b in zip(got.aux_hidden, want.aux_hidden, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    with torch.no_grad():  # the output head runs on its own, after the decoder, as the loss runs it
        torch.testing.assert_close(got.head(got.last_hidden), want.head(want.last_hidden),
                                   rtol=1e-5, atol=1e-5)
    assert_one_root(sharded)  # no unit became a root of its own when it first ran
    if accelerator.is_main_process:
        print("ok")
    torch.distributed.barrier()  # every check done on both ranks


if __name__ == "__main__":
    main(sys.argv[1])
    # Leave without tearing anything down, as tests/helpers/fsdp_gather_check.py explains: a gloo
    # thread still joinable when its process group is destroyed aborts the process.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
