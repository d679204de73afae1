"""Run in each of 2 processes by tests/train/test_rank_collectives.py (`accelerate launch`, gloo):
every multi-rank path with deliberately unequal data per rank. Each rank writes what it saw to
OUT/rank-R.json; a collective one rank skipped would hang the run past the test's timeout.

Usage: accelerate launch --multi_gpu --num_processes 2 tests/helpers/rank_paths.py OUT TARGET
INTACT DAMAGED (TARGET: a folder of `tiny_target("llama")` with a tokenizer; INTACT and DAMAGED:
its eagle1 hidden-state caches, DAMAGED with a byte flipped in one shard)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for tests.helpers


def batch(rows: int, valid: int, seed: int) -> dict:
    """`rows` sequences of 12 tokens, the first `valid` of each attended and in the loss."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 128, (rows, 12), generator=gen)
    attention = torch.zeros(rows, 12, dtype=torch.long)
    attention[:, :valid] = 1
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": attention.clone()}


class Batches:
    """The loop's data interface, as much of it as `init_from_first_batch` reads."""

    def __init__(self, batches):
        self.batches = batches

    def train_batches(self, epoch, skip=0):
        return iter(self.batches)


def main(out: Path, target_dir: Path, intact: Path, damaged: Path) -> None:
    from accelerate import Accelerator

    from draftsmith.errors import DraftsmithError
    from draftsmith.registry import get_spec
    from draftsmith.target.load import TargetSpec
    from draftsmith.train.evaluation import evaluate
    from draftsmith.train.loss_module import LossModule, init_from_first_batch
    from draftsmith.train.recipe import build_recipe
    from draftsmith.train.run import stream_cache
    from tests.helpers.drafters import small_settings
    from tests.helpers.tiny_targets import tiny_target

    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    seen: dict = {"world_size": accelerator.num_processes}
    target = tiny_target("llama")

    # the training loop's evaluation: rank 0 has two held-out batches, rank 1 none
    spec = get_spec("eagle1")
    torch.manual_seed(0)
    drafter = spec.build(target.config, spec.make_config(small_settings("eagle1")))
    model = LossModule(drafter, spec, target, spec.aux_layers(4, spec.make_config({})), False)
    mine = [batch(2, 12, 1), batch(2, 12, 2)] if rank == 0 else []
    seen["evaluate"] = evaluate(model, mine, accelerator)

    # DFlash's start from data statistics: rank 1's batch has no valid row (only position 0)
    spec = get_spec("dflash")
    torch.manual_seed(0)
    dflash = spec.build(target.config, spec.make_config(small_settings("dflash")))
    layers = spec.aux_layers(4, spec.make_config(small_settings("dflash")))
    init_from_first_batch(dflash, target, Batches([batch(2, 12 if rank == 0 else 1, 3)]),
                          layers, accelerator)
    seen["dflash_fc"] = dflash.fc.weight.sum().item()
    # ... and a rank without any batch: every rank keeps its random start
    torch.manual_seed(0)
    untouched = spec.build(target.config, spec.make_config(small_settings("dflash")))
    before = untouched.fc.weight.clone()
    init_from_first_batch(untouched, target, Batches([batch(2, 12, 3)] if rank == 0 else []),
                          layers, accelerator)
    seen["dflash_kept_random_start"] = bool(torch.equal(before, untouched.fc.weight))

    # the offline cache: equal held-out batches per rank (an odd sample is left out), and a
    # damaged shard, which one rank reads, is refused on every rank
    run = build_recipe({"drafter": {"kind": "eagle1"}, "data": {"cache": {"kinds": ["eagle1"]}},
                        "train": {"batch_size": 1, "features": "offline", "eval_fraction": 0.3,
                                  "output_dir": str(out / "run")}})
    loaded = TargetSpec(name=str(target_dir), dtype="float32").load()
    stream = stream_cache(run, intact, loaded, accelerator)
    seen["eval_batches"] = [len(list(stream.eval_batches())), stream.num_eval_batches(),
                            stream.num_held_out]
    try:
        stream_cache(run, damaged, loaded, accelerator)
    except DraftsmithError as err:
        seen["refused"] = str(err)
    # checkpoints need one output folder for every process: a folder each sees alone (as a
    # disk local to each node would be) is refused on every rank
    from draftsmith.train.checkpoint import check_shared_output

    check_shared_output(accelerator, out / "shared")
    try:
        check_shared_output(accelerator, out / f"local-{rank}")
    except DraftsmithError as err:
        seen["local_output_refused"] = str(err)
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(*(Path(arg) for arg in sys.argv[1:5]))
