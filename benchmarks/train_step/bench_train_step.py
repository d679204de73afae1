"""Training throughput of one drafter kind on cached hidden states, written to a JSON file (a
benchmark, not a test).

    # seconds per optimizer step and trained tokens/s of the recipe's kind
    .venv/bin/python benchmarks/train_step/bench_train_step.py \
        --recipe recipes/smollm2-135m/quickstart.yaml --steps 6 \
        --out benchmarks/train_step/eagle3.json
    # EAGLE-3: the teacher gathered once per batch (draft-vocab slice and argmax of the trained
    # rows) against once per training-time-test step, alternated on the same batches
    .venv/bin/python benchmarks/train_step/bench_train_step.py --compare-teacher \
        --out benchmarks/train_step/eagle3_teacher.json

    # EAGLE-3 full training steps (loss, backward, AdamW) of the loss code at git revisions
    # against the working tree's, each from the same start on the same batches, alternated,
    # min over rounds per batch; records whether every loss agrees
    .venv/bin/python benchmarks/train_step/bench_train_step.py --compare-revisions \
        --out benchmarks/train_step/eagle3_packed_rows.json

Needs the recipe's data prepared with a hidden-state cache (e.g. by `bash scripts/quickstart.sh`).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from draftsmith.draft_vocab.file import load_draft_vocab
from draftsmith.files import write_json
from draftsmith.models.eagle3 import eagle3_loss
from draftsmith.models.features import cached_features
from draftsmith.provenance import git_commit
from draftsmith.registry import get_spec
from draftsmith.target.load import load_target
from draftsmith.target.precision import describe_hardware, hardware_record
from draftsmith.train.recipe import load_recipe
from draftsmith.train.run import stream_cache


def throughput(drafter, spec, batches, features_of, steps: int) -> dict:
    """Seconds per optimizer step and trained tokens/s over `steps` batches (after a warm-up)."""
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-4)

    def step(batch) -> int:
        loss, _ = spec.loss(drafter, features_of(batch))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return int(batch["attention_mask"].sum())

    step(batches[0])
    start = time.perf_counter()
    tokens = sum(step(batch) for batch in batches[1:steps + 1])
    seconds = time.perf_counter() - start
    return {"steps": steps, "tokens": tokens, "seconds_per_step": round(seconds / steps, 3),
            "tokens_per_second": round(tokens / seconds, 1)}


def compare_teacher(drafter, batches, features_of, steps: int) -> dict:
    """EAGLE-3 loss forward + backward with the teacher gathered per TTT step or per batch."""
    seconds = {"per_ttt_step": 0.0, "per_batch": 0.0}
    losses, tokens = {"per_ttt_step": [], "per_batch": []}, 0
    for batch in batches[1:steps + 1]:
        tokens += int(batch["attention_mask"].sum())
        for mode in seconds:  # alternate, so a busy machine slows both alike
            features = features_of(batch)
            teacher = features.logits_after if mode == "per_ttt_step" else features
            start = time.perf_counter()
            loss, _ = eagle3_loss(drafter, features.input_ids, features.attention_mask,
                                  features.loss_mask, features.aux_hidden, teacher)
            loss.backward()
            seconds[mode] += time.perf_counter() - start
            drafter.zero_grad()
            losses[mode].append(float(loss.detach()))
    return {"batches": steps, "tokens": tokens,
            "same_losses": losses["per_ttt_step"] == losses["per_batch"],
            **{f"{mode}_seconds_per_step": round(s / steps, 3) for mode, s in seconds.items()},
            **{f"{mode}_tokens_per_second": round(tokens / s, 1) for mode, s in seconds.items()},
            "speedup": round(seconds["per_ttt_step"] / seconds["per_batch"], 2)}


# The loss code each compared revision ran, and how it was given the teacher: the issue's
# baseline gathered the target's logits once per TTT step, later code once per batch.
REVISIONS = {
    "issue_baseline": ("209e9d8e88506f0fc09c64d3602fa735e95dfd73", "per_ttt_step"),
    "teacher_gather": ("1d2c78c159802b21b1c749bc5320d489c49bd197", "per_batch"),
}


def loss_at(revision: str):
    """`eagle3_loss` as it was at a git revision (its module run from `git show`)."""
    path = "draftsmith/models/eagle3.py"
    source = subprocess.run(["git", "show", f"{revision}:{path}"], capture_output=True,
                            text=True, check=True).stdout
    module = types.ModuleType(f"eagle3_at_{revision[:7]}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{revision[:7]}:{path}", "exec"), module.__dict__)
    return module.eagle3_loss


def compare_revisions(drafter, batches, features_of, steps: int, rounds: int) -> dict:
    """Full EAGLE-3 training steps of each revision's loss and the working tree's, alternated
    batch by batch; each round starts every variant from the same weights, and a batch's time
    is its minimum over rounds (a shared machine slows single steps, not the minimum)."""
    losses = {name: loss_at(rev) for name, (rev, _) in REVISIONS.items()}
    losses["now"] = eagle3_loss
    teacher = {name: mode for name, (_, mode) in REVISIONS.items()} | {"now": "per_batch"}
    best = {name: [float("inf")] * steps for name in losses}
    seen = {name: [] for name in losses}
    timed = batches[1:steps + 1]
    for _ in range(rounds):
        state = {}
        for name in losses:
            model = copy.deepcopy(drafter)
            params = [p for p in model.parameters() if p.requires_grad]
            state[name] = (model, torch.optim.AdamW(params, lr=1e-4))
        for i, batch in enumerate([batches[0], *timed]):
            for name, loss_fn in losses.items():
                model, optimizer = state[name]
                features = features_of(batch)
                given = features.logits_after if teacher[name] == "per_ttt_step" else features
                start = time.perf_counter()
                loss, _ = loss_fn(model, features.input_ids, features.attention_mask,
                                  features.loss_mask, features.aux_hidden, given)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                seconds = time.perf_counter() - start
                if i:  # the first batch warms up
                    best[name][i - 1] = min(best[name][i - 1], seconds)
                    seen[name].append(float(loss.detach()))
    tokens = sum(int(batch["attention_mask"].sum()) for batch in timed)
    result = {"steps": steps, "rounds": rounds, "tokens": tokens,
              "revisions": {name: rev for name, (rev, _) in REVISIONS.items()}}
    for name, times in best.items():
        result[f"{name}_seconds_per_step"] = round(sum(times) / steps, 3)
        result[f"{name}_tokens_per_second"] = round(tokens / sum(times), 1)
    base = seen["issue_baseline"]
    result["max_relative_loss_difference"] = {
        name: max(abs(a - b) / abs(b) for a, b in zip(values, base, strict=True))
        for name, values in seen.items() if name != "issue_baseline"}
    for name in ("teacher_gather", "now"):
        result[f"{name}_speedup_over_issue_baseline"] = round(
            sum(best["issue_baseline"]) / sum(best[name]), 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="recipes/smollm2-135m/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after one warm-up)")
    parser.add_argument("--compare-teacher", action="store_true",
                        help="EAGLE-3: teacher gathered per batch against per TTT step")
    parser.add_argument("--compare-revisions", action="store_true",
                        help="EAGLE-3: full steps of the loss code at REVISIONS against now")
    parser.add_argument("--rounds", type=int, default=3,
                        help="--compare-revisions: passes over the batches (min per batch)")
    parser.add_argument("--out", default="benchmarks/train_step/eagle3.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, args.overrides)
    target = load_target(recipe.target.name, dtype=recipe.target.dtype)
    out_dir = Path(recipe.data["out_dir"])
    stream = stream_cache(recipe, out_dir / "cache", target)
    spec, config = get_spec(recipe.kind), recipe.drafter_config
    drafter = spec.build(target.model.config, config)
    vocab_path = out_dir / "draft_vocab.safetensors"
    if spec.uses_draft_vocab and vocab_path.is_file():
        vocab = load_draft_vocab(vocab_path)
        drafter.set_draft_vocab(vocab.d2t, vocab.t2d)
    drafter.init_from_target(target.model)
    layers = target.model.config.num_hidden_layers
    aux, head, size = spec.aux_layers(layers, config), target.model.get_output_embeddings(), \
        recipe.train.batch_size
    batches = list(itertools.islice(stream.train_batches(0), args.steps + 1))

    def features_of(batch):
        return cached_features(batch, head, aux, layers)

    if (args.compare_teacher or args.compare_revisions) and recipe.kind != "eagle3":
        parser.error("--compare-teacher and --compare-revisions measure EAGLE-3's loss: use an "
                     "eagle3 recipe")
    if args.compare_teacher:
        result = compare_teacher(drafter, batches, features_of, args.steps)
    elif args.compare_revisions:
        result = compare_revisions(drafter, batches, features_of, args.steps, args.rounds)
    else:
        result = throughput(drafter, spec, batches, features_of, args.steps)
    payload = {"kind": recipe.kind, "recipe": args.recipe, "overrides": args.overrides,
               "batch_size": size, **result, "commit": git_commit(),
               "hardware": describe_hardware(hardware_record("cpu", target.dtype_choice))}
    write_json(args.out, payload)
    print(payload)


if __name__ == "__main__":
    main()
