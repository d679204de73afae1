"""Training throughput of one drafter kind on cached hidden states: seconds per optimizer step and
trained tokens per second, written to a JSON file (a benchmark, not a test).

    .venv/bin/python scripts/bench_train_step.py --recipe recipes/smollm2-135m/quickstart.yaml \
        --steps 6 --out benchmarks/train_step/eagle3.json

Needs the recipe's data prepared with a hidden-state cache (e.g. by `bash scripts/quickstart.sh`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from draftsmith.data.draft_vocab import load_draft_vocab
from draftsmith.eval.evaluate import git_commit
from draftsmith.files import write_json
from draftsmith.precision import describe_hardware, hardware_record
from draftsmith.registry import cached_features, get_spec
from draftsmith.target import load_target
from draftsmith.train.batching import collate
from draftsmith.train.recipe import load_recipe
from draftsmith.train.run import read_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="recipes/smollm2-135m/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after one warm-up)")
    parser.add_argument("--out", default="benchmarks/train_step/eagle3.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, args.overrides)
    target = load_target(recipe.target.name, dtype=recipe.target.dtype)
    out_dir = Path(recipe.data["out_dir"])
    examples = read_cache(recipe, out_dir / "cache", target)
    spec, config = get_spec(recipe.kind), recipe.drafter_config()
    drafter = spec.build(target.model.config, config)
    vocab_path = out_dir / "draft_vocab.safetensors"
    if spec.uses_draft_vocab and vocab_path.is_file():
        vocab = load_draft_vocab(vocab_path)
        drafter.set_draft_vocab(vocab.d2t, vocab.t2d)
    drafter.init_from_target(target.model)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4)
    layers = target.model.config.num_hidden_layers
    aux = spec.aux_layers(layers, config)
    head = target.model.get_output_embeddings()
    size = recipe.train.batch_size

    def step(i: int) -> int:
        batch = collate(examples[i * size:(i + 1) * size], recipe.train.max_length)
        loss, _ = spec.loss(drafter, cached_features(batch, head, aux, layers))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return int(batch["attention_mask"].sum())

    step(0)
    start = time.perf_counter()
    tokens = sum(step(i) for i in range(1, args.steps + 1))
    seconds = time.perf_counter() - start
    payload = {"kind": recipe.kind, "recipe": args.recipe, "overrides": args.overrides,
               "steps": args.steps, "batch_size": size, "tokens": tokens,
               "seconds_per_step": round(seconds / args.steps, 3),
               "tokens_per_second": round(tokens / seconds, 1), "commit": git_commit(),
               "hardware": describe_hardware(hardware_record("cpu", target.dtype_choice))}
    write_json(args.out, payload)
    print(payload)


if __name__ == "__main__":
    main()
