"""Would storing the target's top-k logits in the cache beat recomputing the head? Times the head
recompute an offline EAGLE-3 step does (the target's head over the draft vocabulary at trained
positions, `Features.restricted`) against the whole step (forward + backward), SmolLM2-135M
shapes, bf16 autocast, and prints the bytes per token top-k logits would add.

    python benchmarks/memory/bench_topk_logits.py   # writes benchmarks/memory/topk_logits.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoConfig

from draftsmith.draft_vocab.file import load_draft_vocab
from draftsmith.models.eagle3 import Eagle3Config
from draftsmith.models.features import cached_features
from draftsmith.registry import get_spec


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target-config",
                        default=str(Path.home() / ".cache/draftsmith/models/smollm2-135m-instruct"))
    parser.add_argument("--vocab", default="runs/bench29/bf16/draft_vocab.safetensors")
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/memory/topk_logits.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.target_config)
    spec = get_spec("eagle3")
    drafter = spec.build(config, Eagle3Config(draft_vocab_size=8192, ttt_steps=args.ttt_steps))
    vocab = load_draft_vocab(args.vocab)
    drafter.set_draft_vocab(vocab.d2t, vocab.t2d)
    layers, hidden = config.num_hidden_layers, config.hidden_size
    head = torch.nn.Linear(hidden, config.vocab_size, bias=False).to(torch.bfloat16)
    head.requires_grad_(False)
    aux = spec.aux_layers(layers, drafter.config)
    shapes = {}
    for b, t in ((4, 192), (1, 2048)):
        batch = {"input_ids": torch.randint(0, config.vocab_size, (b, t)),
                 "attention_mask": torch.ones(b, t, dtype=torch.long),
                 "loss_mask": torch.ones(b, t, dtype=torch.long)}
        for i in sorted({*(a + 1 for a in aux), layers}):
            batch[f"hidden_states.{i}"] = torch.randn(b, t, hidden, dtype=torch.bfloat16)
        with torch.no_grad():
            batch["target_argmax"] = head(batch[f"hidden_states.{layers}"]).argmax(-1)

        def head_only(batch=batch):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                cached_features(batch, head, aux, layers).restricted(drafter.draft_ids())

        def step(batch=batch):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, _ = spec.loss(drafter, cached_features(batch, head, aux, layers))
            loss.backward()
            drafter.zero_grad(set_to_none=True)

        head_s, step_s = median_seconds(head_only, args.repeats), median_seconds(step,
                                                                                 args.repeats)
        shapes[f"{b}x{t}"] = {"head_recompute_seconds": round(head_s, 4),
                              "step_seconds": round(step_s, 4),
                              "head_share_of_step": round(head_s / step_s, 3)}
        print(f"batch {b}x{t}: {shapes[f'{b}x{t}']}", flush=True)
    id_bytes = 2 if config.vocab_size <= 65536 else 4
    result = {"ttt_steps": args.ttt_steps, "shapes": shapes,
              "topk_bytes_per_token": {k: k * (2 + id_bytes) for k in (16, 64, 256)},
              "note": "top-k values in bf16 plus token ids; a step's head recompute is the most "
                      "that storing them could save"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
