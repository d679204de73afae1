"""Convert draftsmith's hidden-state cache into the offline data folder vllm-project/speculators
0.9 trains EAGLE-3 from, so the peer trains on exactly the conversations and features ours does.

    .venv/bin/python benchmarks/peer-recipe/convert_cache.py --cache runs/peer-recipe/data/cache \
        --draft-vocab runs/peer-recipe/data/draft_vocab.safetensors \
        --out runs/peer-recipe/speculators-data --eval-fraction 0.025

What speculators reads (speculators/train/data.py `ArrowDataset`, hs_connectors `FileTransfer`):

- a `datasets` folder (`load_from_disk`, torch format) with `input_ids`, `loss_mask` and
  `seq_len` per conversation; its split is positional: the first `int(n * train_data_ratio)`
  rows train, the rest validate;
- `hidden_states/hs_{i}.safetensors` per row: `hidden_states` [T, 4, H] (the three fused layers,
  then the target's last hidden state) and `token_ids` [T], equal to the row's `input_ids`;
- `d2t-{Vd}.npy` (int64 offsets, draft id + d2t = target id) and `t2d-{Vd}.npy` (bool [V]).

Two conversions. Our held-out conversations (`train/cache_stream.py` `held_out`, the same seed
and fraction as our runs) are put last, and `split.json` gives the `--train-data-ratio` that
makes exactly them speculators' validation rows, so neither trainer sees them. speculators'
last layer is the PRE-norm state (it applies the target's final norm itself, `verifier_norm`);
our cache stores `hidden_states[N]`, which Hugging Face returns AFTER the final RMSNorm. Dividing
by the norm's weight gives a vector of unit RMS that the same norm maps back to the stored state
(RMSNorm(x / w) = x when rms(x / w) = 1, up to its epsilon), so speculators' targets equal ours.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from draftsmith.data.cache_reader import FeatureCache
from draftsmith.models.target_states import hidden_key
from draftsmith.train.cache_stream import held_out

TARGET = Path("/root/.cache/draftsmith/models/smollm2-135m-instruct")


def final_norm_weight(target: Path) -> torch.Tensor:
    """The target's final RMSNorm weight (H,), float32; it must have no zero entry."""
    with safe_open(str(target / "model.safetensors"), "pt") as handle:
        weight = handle.get_tensor("model.norm.weight").float()
    if bool((weight == 0).any()):
        raise SystemExit(f"{target}: model.norm.weight has zero entries; the post-norm state "
                         "cannot be mapped back to a pre-norm one")
    return weight


def convert(args) -> dict:
    """Write the speculators folder; returns the split record (also written to split.json)."""
    cache = FeatureCache.open(args.cache)
    layers = list(cache.layers)
    if len(layers) != 4:
        raise SystemExit(f"{args.cache} holds layers {layers}; speculators' EAGLE-3 needs three "
                         "fused layers and the last one (data.cache.kinds: [eagle3])")
    weight = final_norm_weight(Path(args.target))
    held = held_out(torch.arange(cache.num_samples), args.seed, args.eval_fraction).tolist()
    order = [p for p in range(len(held)) if not held[p]] + [p for p in range(len(held)) if held[p]]
    row_of = {position: row for row, position in enumerate(order)}
    out = Path(args.out)
    rows: list[dict] = [{} for _ in order]
    samples = cache.iter_samples(keys=[hidden_key(i) for i in layers])
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    for position, sample in enumerate(samples):
        states = [sample[hidden_key(i)].float() for i in layers]
        states[-1] = states[-1] / weight  # post-norm -> a pre-norm state (module docstring)
        ids = sample["input_ids"].long().contiguous()
        stored = sample[hidden_key(layers[0])].dtype  # the cache's own precision, kept
        save_file({"hidden_states": torch.stack(states, dim=1).to(stored).contiguous(),
                   "token_ids": ids},
                  str(out / "hidden_states" / f"hs_{row_of[position]}.safetensors"))
        rows[row_of[position]] = {"input_ids": ids.tolist(),
                                  "loss_mask": sample["loss_mask"].long().tolist(),
                                  "seq_len": len(ids), "cache_position": position}
    dataset = Dataset.from_list(rows)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(out))  # beside hidden_states/, as speculators reads it
    vocab = load_file(args.draft_vocab)
    size = vocab["d2t"].shape[0]
    np.save(out / f"d2t-{size}.npy", vocab["d2t"].long().numpy())
    np.save(out / f"t2d-{size}.npy", vocab["t2d"].bool().numpy())
    n_held = sum(held)
    split = {"conversations": len(order), "train": len(order) - n_held, "held_out": n_held,
             "train_data_ratio": (len(order) - n_held + 0.5) / len(order),
             "eval_fraction": args.eval_fraction, "seed": args.seed, "layers": layers,
             "tokens": sum(r["seq_len"] for r in rows), "draft_vocab_size": size}
    (out / "split.json").write_text(json.dumps(split, indent=1) + "\n")
    return split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", required=True, help="draftsmith's cache folder")
    parser.add_argument("--draft-vocab", required=True, help="the data step's draft_vocab file")
    parser.add_argument("--target", default=str(TARGET), help="the target's model folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--eval-fraction", type=float, default=0.025,
                        help="our runs' train.eval_fraction (the same conversations held out)")
    parser.add_argument("--seed", type=int, default=0, help="our runs' train.seed")
    print(json.dumps(convert(parser.parse_args())))


if __name__ == "__main__":
    main()
