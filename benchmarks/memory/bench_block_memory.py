"""Training memory of the block drafters (issue 30): peak memory and time of one DFlash / DSpark
training step (forward + backward) at 384 and 2048 tokens with 64 and 512 anchors, with the
chunked training attention (each chunk's scores at most `CHUNK_SCORES` elements) and, for
comparison, with every block in one chunk (the dense (blocks x context) scores a mask-based
attention materialises per layer).

    python benchmarks/memory/bench_block_memory.py     # -> benchmarks/memory/block_drafters.json

The step uses SmolLM2-135M's shapes (its config), the reference DFlash drafter (block 16, 5 layers,
layer ids [1, 8, 14, 20, 27]) or DSpark (block 7), random hidden states of the fused layers and a
random head of the target's size: memory and time depend on shapes only. Each measurement runs in
its own process (`--worker`); its peak is sampled from /proc/self/statm every 2 ms (PeakSampler of
benchmarks/memory/bench_memory.py), above the process's RSS before the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file: benchmarks/memory/)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_memory import PeakSampler, rss_bytes  # noqa: E402  (a sibling script)


def worker(args) -> dict:
    """One training step of `args.kind` at `args.tokens` tokens and `args.anchors` anchors."""
    import torch
    from transformers import AutoConfig

    from draftsmith.models import block_layers
    from draftsmith.models.features import cached_features
    from draftsmith.registry import get_spec

    if args.one_chunk:
        block_layers.CHUNK_SCORES = 1 << 62
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.target_config)
    spec = get_spec(args.kind)
    settings = {"anchors_per_sequence": args.anchors, "mask_token_id": 16}
    drafter = spec.build(config, spec.make_config(settings))
    layers = config.num_hidden_layers
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False).to(torch.bfloat16)
    head.requires_grad_(False)
    drafter.lm_head.weight.data.copy_(head.weight.data)
    aux = spec.aux_layers(layers, drafter.config)
    t = args.tokens
    batch = {"input_ids": torch.randint(0, config.vocab_size, (1, t)),
             "attention_mask": torch.ones(1, t, dtype=torch.long),
             "loss_mask": torch.ones(1, t, dtype=torch.long)}
    batch["loss_mask"][:, : t // 8] = 0  # a prompt
    for i in sorted({*(a + 1 for a in aux), layers}):
        batch[f"hidden_states.{i}"] = torch.randn(1, t, config.hidden_size, dtype=torch.bfloat16)
    if args.dtype == "auto":  # what `mixed_precision: auto` measures on this machine
        from draftsmith.target.precision import choose_dtype

        args.dtype = choose_dtype("auto", "cpu", config.hidden_size,
                                  getattr(config, "intermediate_size", None)).dtype
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32

    def step():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss, _ = spec.loss(drafter, cached_features(batch, head, aux, layers))
        loss.backward()
        drafter.zero_grad(set_to_none=True)

    baseline = rss_bytes()
    with PeakSampler() as sampler:
        began = time.perf_counter()
        step()
        first = time.perf_counter() - began
    times = [first]
    for _ in range(args.repeats):
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    return {"peak_step_mib": round((sampler.peak - baseline) / 2 ** 20, 1),
            "baseline_mib": round(baseline / 2 ** 20, 1),
            "seconds": [round(x, 3) for x in times],
            "median_seconds": round(statistics.median(times), 3),
            "block_size": drafter.block_size, "num_layers": len(drafter.layers),
            "target_layer_ids": drafter.target_layer_ids}


def run_worker(extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__, "--worker", *extra], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--kind", default="dflash", choices=["dflash", "dspark"])
    parser.add_argument("--kinds", default="dflash,dspark")
    parser.add_argument("--tokens", type=int, default=384)
    parser.add_argument("--anchors", type=int, default=64)
    parser.add_argument("--one-chunk", action="store_true", help="every block in one chunk")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="autocast dtype of the step (auto: measured on this machine, as "
                        "training's `mixed_precision: auto` chooses)")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps after the first")
    parser.add_argument("--target-config",
                        default=str(Path.home() / ".cache/draftsmith/models/smollm2-135m-instruct"))
    parser.add_argument("--out", default="benchmarks/memory/block_drafters.json")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    from draftsmith.files import write_json
    from draftsmith.target.precision import hardware_record

    rows = []
    for kind in args.kinds.split(","):
        for tokens in (384, 2048):
            for anchors in (64, 512):
                for one_chunk in (False, True):
                    extra = ["--kind", kind, "--tokens", str(tokens), "--anchors", str(anchors),
                             "--dtype", args.dtype, "--repeats", str(args.repeats),
                             "--target-config", args.target_config]
                    result = run_worker(extra + (["--one-chunk"] if one_chunk else []))
                    row = {"kind": kind, "tokens": tokens, "anchors": anchors,
                           "attention": "one chunk (dense scores)" if one_chunk else "chunked",
                           **result}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    write_json(Path(args.out), {
        "what": __doc__.split("\n\n")[0], "dtype": args.dtype, "hardware": hardware_record(),
        "command": "python benchmarks/memory/bench_block_memory.py", "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
