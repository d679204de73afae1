"""The peer itself: vllm-project/speculators 0.9 trains its own EAGLE-3 recipe on a converted copy
of our cache (`convert_cache.py`), on this CPU, and its drafter is scored on our held-out
conversations by our measure (a benchmark, not a test).

    flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/peer-recipe/peer_speculators.py \
        train --data runs/peer-recipe/speculators-data --steps 200 \
        --save runs/peer-recipe/minutes/speculators
    .venv/bin/python benchmarks/peer-recipe/peer_speculators.py score \
        --drafter runs/peer-recipe/minutes/speculators/1

What stops speculators 0.9 on a CPU, and what `train` changes in this process only (its recipe
untouched): the trainer moves the model and every batch to `get_local_rank()` (0, i.e. cuda:0),
autocasts on "cuda" when no accelerator is found, and calls `torch.accelerator.synchronize()`
in its step timer (which raises without an accelerator); its default `fused` loss is a Triton
kernel and its default `simple_flex_attention` needs a compiled flex attention. So the device is
"cpu", synchronize is a no-op, the loss is its `eager` implementation and attention `sdpa` (the
same mathematics), and data loading stays in the process (`--num-workers 0`, as ours does).
Its loop also steps once more in each epoch past `max_steps`; an epoch begun at the step limit
is skipped here.

Scoring (`score`) uses our held-out split and our measure exactly: the held-out batches of our
`CacheStream` (the same seed and fraction as our runs), per batch the share of trained tokens
whose target choice (the cache's `target_argmax`) the drafter's step-j draft equals (a choice
outside the draft vocabulary is a miss), the mean over batches, and `simulated_tau` of the three
(draftsmith/models/eagle3.py `eagle3_loss`, draftsmith/train/evaluation.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from draftsmith.data.cache_reader import FeatureCache
from draftsmith.files import write_json
from draftsmith.models.target_states import hidden_key
from draftsmith.target.precision import choose_mixed_precision
from draftsmith.train.cache_stream import CacheStream
from draftsmith.train.metrics import simulated_tau

TARGET = "/root/.cache/draftsmith/models/smollm2-135m-instruct"
FUSED = (2, 15, 27)  # speculators' default [2, N // 2, N - 3] for N = 30: our cache's layers


def patch_for_cpu() -> None:
    """The four changes that let speculators 0.9's trainer run on a CPU (module docstring)."""
    from speculators.train import trainer

    torch.accelerator.synchronize = lambda *a, **k: None
    trainer.get_local_rank = lambda: "cpu"
    init, train_epoch = trainer.Trainer.__init__, trainer.Trainer.train_epoch

    def cpu_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.device_type = "cpu"

    def bounded_epoch(self, epoch, **kwargs):
        if self.config.max_steps is None or self.global_step < self.config.max_steps:
            train_epoch(self, epoch, **kwargs)

    trainer.Trainer.__init__, trainer.Trainer.train_epoch = cpu_init, bounded_epoch


class MetricsFile(logging.Handler):
    """speculators' per-step metric records (mappings sent to its `speculators.metrics` logger,
    which has no file backend) as JSON lines, each with the wall-clock time it was logged."""

    def __init__(self, path: Path):
        super().__init__()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("w")

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "speculators.metrics" and isinstance(record.msg, dict):
            self.file.write(json.dumps({"time": time.time(), **record.msg}, default=float) + "\n")
            self.file.flush()


def log_metrics(path: Path) -> None:
    """Send speculators' metric records to `path` (the root logger, which its setup keeps)."""
    logging.getLogger().addHandler(MetricsFile(path))


def train(args) -> None:
    """speculators' own EAGLE-3 recipe (its defaults) for `--steps` steps on the converted data."""
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    torch.set_num_threads(args.threads)
    split = json.loads((Path(args.data) / "split.json").read_text())
    per_epoch = split["tokens"] / args.total_seq_len  # packed: about this many steps an epoch
    argv = ["--speculator-type", "eagle3", "--verifier-name-or-path", TARGET,
            "--data-path", args.data, "--save-path", args.save, "--log-dir", args.save,
            "--draft-vocab-size", str(split["draft_vocab_size"]),
            "--train-data-ratio", str(split["train_data_ratio"]),
            "--total-seq-len", str(args.total_seq_len), "--max-steps", str(args.steps),
            "--epochs", str(math.ceil(args.steps / per_epoch) + 1), "--on-missing", "raise",
            "--num-workers", "0", "--loss-implementation", "eager",
            "--draft-attn-impl", "sdpa", "--no-resume-from-checkpoint"]
    patch_for_cpu()
    log_metrics(Path(args.save) / "metrics.jsonl")
    print("speculators train", " ".join(argv), flush=True)
    main(TrainConfig.resolve(argv))


def load_drafter(folder: Path):
    """A speculators EAGLE-3 checkpoint (its trainer's or our `export --format speculators`),
    the target's embeddings, head and final norm loaded from TARGET, on the CPU, in eval mode."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "sdpa"
    config.speculators_config.verifier.name_or_path = TARGET
    model = Eagle3DraftModel.from_pretrained(folder, config=config, verifier=TARGET)
    return model.float().eval()


@torch.no_grad()
def row_counts(model, sample: dict[str, torch.Tensor], steps: int, bf16: bool
               ) -> list[tuple[int, int]]:
    """(hits, trained tokens) of one conversation at each draft step, by our measure."""
    n = int(sample["attention_mask"].sum())
    ids, mask = sample["input_ids"][:n], sample["loss_mask"][:n] > 0
    choice = sample["target_argmax"][:n]
    fused = torch.cat([sample[hidden_key(i)][:n].float() for i in FUSED], dim=-1)
    # speculators' shift_batch: input token i + 1 beside the fused state of position i
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        drafts = model(hidden_states=fused[None, :-1], input_ids=ids[None, 1:],
                       document_ids=torch.zeros(1, n - 1, dtype=torch.long),
                       position_ids=torch.arange(1, n)[None], ttt_steps=steps)
    counts = []
    for j in range(steps):  # step j at position i drafts token i + j + 2
        draft = drafts[j][0, :max(n - 2 - j, 0)]
        wanted = choice[1 + j:n - 1]
        valid = mask[2 + j:]
        hits = valid & model.t2d[wanted].bool() & (draft + model.d2t[draft] == wanted)
        counts.append((int(hits.sum()), int(valid.sum())))
    return counts


def score(args) -> dict:
    """Held-out acc@1..3 and simulated tau of a speculators drafter on our held-out batches."""
    cache = FeatureCache.open(Path(args.data_dir) / "cache")
    stream = CacheStream(cache, [hidden_key(i) for i in FUSED], ("target_argmax",),
                         batch_size=args.batch_size, max_length=args.max_length, seed=args.seed,
                         eval_fraction=args.eval_fraction, rank=0, world_size=1, window=1)
    model = load_drafter(Path(args.drafter))
    # the precision our runs' held-out evaluation uses here (`mixed_precision: auto`, measured)
    mixed, _ = choose_mixed_precision("auto", "cpu",
                                      model.config.transformer_layer_config.hidden_size)
    per_batch: list[list[float]] = []
    for batch in stream.eval_batches():
        rows = [row_counts(model, {k: v[r] for k, v in batch.items()}, 3, mixed == "bf16")
                for r in range(batch["input_ids"].shape[0])]
        per_batch.append([sum(row[j][0] for row in rows) / max(sum(row[j][1] for row in rows), 1)
                          for j in range(3)])
    accs = [statistics.fmean(b[j] for b in per_batch) for j in range(3)]
    result = {"drafter": args.drafter, "held_out": stream.num_held_out, "mixed_precision": mixed,
              "batches": len(per_batch),
              **{f"heldout_acc@{k + 1}": round(a, 4) for k, a in enumerate(accs)},
              "heldout_simulated_tau": round(simulated_tau(accs), 4)}
    if args.out:
        write_json(Path(args.out), result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("phase", choices=["train", "score"])
    parser.add_argument("--data", default="runs/peer-recipe/speculators-data",
                        help="train: the converted folder (convert_cache.py)")
    parser.add_argument("--save", default="runs/peer-recipe/minutes/speculators")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--total-seq-len", type=int, default=1536,
                        help="packed tokens a step (ours: batch_size 4 x max_length 384)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--drafter", help="score: a checkpoint folder with config.json")
    parser.add_argument("--data-dir", default="runs/peer-recipe/data-full",
                        help="score: our data folder (its cache)")
    parser.add_argument("--eval-fraction", type=float, default=0.025)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=384)
    parser.add_argument("--out", default=None, help="score: write the result here (JSON)")
    args = parser.parse_args()
    if args.phase == "train":
        train(args)
    else:
        print(json.dumps(score(args)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
