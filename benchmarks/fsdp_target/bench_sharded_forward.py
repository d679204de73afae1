"""Seconds per online-feature forward of a target sharded over 2 processes (FSDP2, what a
training step runs: the decoder with its hidden states kept, then the output head), for the
sharding `draftsmith.train.target_parts` does in the checkout on PYTHONPATH.

    accelerate launch --multi_gpu --num_processes 2 --mixed_precision no --dynamo_backend no \\
        benchmarks/fsdp_target/bench_sharded_forward.py --out RESULT.json

Run it once per checkout (e.g. `git archive COMMIT draftsmith | tar -x -C OLD` and
`PYTHONPATH=OLD`) on the same machine, one after the other; see README.md for the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator


def save_target(folder: Path, layers: int, hidden: int) -> None:
    """A random Llama of `layers` x `hidden` (safetensors), with a word-level tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64,
                         num_key_value_heads=hidden // 128)
    LlamaForCausalLM(config).save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(4096)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0"))
                            ).save_pretrained(folder)


def main() -> None:
    import draftsmith.train.target_parts as target_parts
    from draftsmith.models.features import target_features
    from draftsmith.target.load import TargetSpec

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "target"
        names = [str(folder)]
        dist.broadcast_object_list(names)  # rank 0's folder, on one host
        folder = Path(names[0])
        if accelerator.is_main_process:
            save_target(folder, args.layers, args.hidden)
        dist.barrier()
        model = target_parts.load_sharded_target(TargetSpec(name=str(folder), dtype="float32"),
                                                 "cpu").model
        dist.barrier()
    gen = torch.Generator().manual_seed(accelerator.process_index)
    ids = torch.randint(2, 4096, (args.batch, args.length), generator=gen)
    mask = torch.ones_like(ids)
    layers = model.config.num_hidden_layers
    aux = [1, layers // 2, layers - 2]
    seconds = []
    for _ in range(args.repeats + 2):  # the first two warm up
        dist.barrier()
        start = time.perf_counter()
        with torch.no_grad():
            features = target_features(model, ids, mask, mask, aux)
            features.head(features.last_hidden[:, -8:])
        seconds.append(time.perf_counter() - start)
    times = torch.tensor(seconds[2:])
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
    if accelerator.is_main_process:
        result = {"target_parts": target_parts.__file__, "layers": args.layers,
                  "hidden": args.hidden, "batch": args.batch, "length": args.length,
                  "processes": accelerator.num_processes,
                  "torch_threads": torch.get_num_threads(),
                  "median_s": statistics.median(times.tolist()),
                  "min_s": min(times.tolist()), "seconds": times.tolist()}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "seconds"}))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # no gloo teardown (see draftsmith/process_group.py)


if __name__ == "__main__":
    main()
