"""EAGLE-3 training step with the teacher gathered once per batch (draft-vocab slice and argmax of
the trained rows) against once per training-time-test step (the earlier path): the same loss to
the bit, the time of each, alternated on the same batches; written to a JSON file.

    .venv/bin/python scripts/bench_eagle3_teacher.py --out benchmarks/train_step/eagle3_teacher.json

Needs the quickstart's data with its hidden-state cache (`bash scripts/quickstart.sh`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from draftsmith.data.draft_vocab import load_draft_vocab
from draftsmith.eval.evaluate import git_commit
from draftsmith.files import write_json
from draftsmith.models.eagle3 import eagle3_loss
from draftsmith.precision import describe_hardware, hardware_record
from draftsmith.registry import cached_features, get_spec
from draftsmith.target import load_target
from draftsmith.train.batching import collate
from draftsmith.train.recipe import load_recipe
from draftsmith.train.run import read_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="recipes/smollm2-135m/quickstart.yaml")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/train_step/eagle3_teacher.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, args.overrides)
    target = load_target(recipe.target.name, dtype=recipe.target.dtype)
    out_dir = Path(recipe.data["out_dir"])
    examples = read_cache(recipe, out_dir / "cache", target)
    spec, config = get_spec("eagle3"), recipe.drafter_config()
    drafter = spec.build(target.model.config, config)
    vocab = load_draft_vocab(out_dir / "draft_vocab.safetensors")
    drafter.set_draft_vocab(vocab.d2t, vocab.t2d)
    drafter.init_from_target(target.model)
    layers = target.model.config.num_hidden_layers
    aux, head, size = spec.aux_layers(layers, config), target.model.get_output_embeddings(), \
        recipe.train.batch_size
    seconds = {"per_ttt_step": 0.0, "per_batch": 0.0}
    losses, tokens = {"per_ttt_step": [], "per_batch": []}, 0
    for i in range(1, args.batches + 1):
        batch = collate(examples[i * size:(i + 1) * size], recipe.train.max_length)
        tokens += int(batch["attention_mask"].sum())
        for mode in seconds:  # alternate, so a busy machine slows both alike
            features = cached_features(batch, head, aux, layers)
            teacher = features.logits_after if mode == "per_ttt_step" else features
            start = time.perf_counter()
            loss, _ = eagle3_loss(drafter, features.input_ids, features.attention_mask,
                                  features.loss_mask, features.aux_hidden, teacher)
            loss.backward()
            seconds[mode] += time.perf_counter() - start
            drafter.zero_grad()
            losses[mode].append(float(loss.detach()))
    payload = {"recipe": args.recipe, "overrides": args.overrides, "batches": args.batches,
               "batch_size": size,
               "tokens": tokens, "same_losses": losses["per_ttt_step"] == losses["per_batch"],
               **{f"{mode}_seconds_per_step": round(s / args.batches, 3)
                  for mode, s in seconds.items()},
               **{f"{mode}_tokens_per_second": round(tokens / s, 1) for mode, s in seconds.items()},
               "speedup": round(seconds["per_ttt_step"] / seconds["per_batch"], 2),
               "commit": git_commit(),
               "hardware": describe_hardware(hardware_record("cpu", target.dtype_choice))}
    write_json(args.out, payload)
    print(payload)


if __name__ == "__main__":
    main()
