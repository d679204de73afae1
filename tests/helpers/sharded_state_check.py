"""Run by tests/train/test_sharded_state.py under a 2-process launch (gloo): an FSDP2-sharded
EAGLE-3 drafter trained 2 steps on a sharded target, checkpointed by the training loop's
`save_state` (its sharded state through `save_sharded_state`), trained 2 more; a second drafter
started from other weights, resumed by `load_checkpoint` and trained the same 2 steps, ends with
the same losses and weights bit for bit. Prints `ok` and the sharded files' sizes on rank 0."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.distributed.fsdp import fully_shard

from draftsmith.registry import get_spec
from draftsmith.target.load import TargetSpec
from draftsmith.train.checkpoint import save_state
from draftsmith.train.loss_module import LossModule
from draftsmith.train.resume import load_checkpoint, scheduler_state
from draftsmith.train.sharded_state import is_sharded
from draftsmith.train.target_parts import full_state_dict, gathered, load_sharded_target

SAVED_AT, STEPS = 2, 4


def build(target, seed: int):
    """A drafter of `seed`'s weights in the module training shards, FSDP2-sharded, and AdamW."""
    spec = get_spec("eagle3")
    config = spec.make_config({"draft_vocab_size": 128, "ttt_steps": 2})
    torch.manual_seed(seed)
    drafter = spec.build(target.config, config)
    with gathered(target.get_input_embeddings(), target.get_output_embeddings()):
        drafter.init_from_target(target)
    if seed:  # other starting weights than the saved run's
        torch.nn.init.normal_(drafter.fc.weight)
    aux = spec.aux_layers(target.config.num_hidden_layers, config)
    model = LossModule(drafter, spec, target, aux, joint=False)
    fully_shard(model)
    assert is_sharded(model)
    return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)


def batch(step: int, rank: int) -> dict:
    """This rank's batch of `step`: other tokens on each rank and step, right padding."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    ids = torch.randint(2, 128, (2, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    loss_mask = mask.clone()
    loss_mask[:, :3] = 0
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}


def train(model, optimizer, steps: range, rank: int) -> list[float]:
    losses = []
    for step in steps:
        loss, _ = model(batch(step, rank))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def register(accelerator, model, optimizer) -> None:
    """Make `model` and `optimizer` the run's prepared ones, as `accelerator.prepare` does under
    accelerate's FSDP2 plugin (which CPU hosts lack; it would wrap them in DDP here)."""
    accelerator._models[:] = [model]
    accelerator._optimizers[:] = [optimizer]


def main(target_folder: str, out: str) -> None:
    accelerator = Accelerator(cpu=True)
    rank, out_dir = accelerator.process_index, Path(out)
    target = load_sharded_target(TargetSpec(name=target_folder, dtype="float32"), "cpu").model
    model, optimizer = build(target, seed=0)
    register(accelerator, model, optimizer)
    first = train(model, optimizer, range(SAVED_AT), rank)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    folder = save_state(accelerator, out_dir, SAVED_AT, {"scheduler": scheduler_state(schedule)})
    saved = full_state_dict(model)
    rest = train(model, optimizer, range(SAVED_AT, STEPS), rank)
    straight = full_state_dict(model)

    model, optimizer = build(target, seed=1)
    register(accelerator, model, optimizer)
    assert not torch.equal(full_state_dict(model)["drafter.fc.weight"], saved["drafter.fc.weight"])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    load_checkpoint(accelerator, folder, schedule, json.loads((folder / "progress.json").read_text()))
    loaded = full_state_dict(model)
    resumed = train(model, optimizer, range(SAVED_AT, STEPS), rank)
    ended = full_state_dict(model)
    for key, tensor in saved.items():
        assert torch.equal(loaded[key], tensor), f"{key} loaded other values than saved"
    assert resumed == rest, (resumed, rest)
    for key, tensor in straight.items():
        assert torch.equal(ended[key], tensor), f"{key} differs from the uninterrupted run's"
    assert not torch.equal(straight["drafter.fc.weight"], saved["drafter.fc.weight"])
    whole = sum(t.numel() * t.element_size() for t in saved.values())
    if accelerator.is_main_process:
        sizes = {p.name: p.stat().st_size for p in sorted((folder / "sharded").iterdir())}
        print(json.dumps({"files": sizes, "drafter_bytes": whole, "losses": first + rest}))
        print("ok")
    torch.distributed.barrier()  # every check done on both ranks


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    # Leave without tearing anything down, as tests/helpers/fsdp_gather_check.py explains.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
