"""A P-EAGLE drafter of middling acceptance for the vLLM serving proof: trained briefly on the
target's own greedy answers to the proof's prompts, so every depth is accepted sometimes, not
always (an overfit drafter accepted at every position would hide a layout mismatch).

    .venv/bin/python benchmarks/peagle/proof_drafter.py OUT_DIR [--steps N]
    .venv/bin/python benchmarks/peagle/serve_vllm.py OUT_DIR/drafter OUT_DIR/serve --limit 2 \
        --max-new-tokens 32
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.drafter_folder import write_drafter_folder
from draftsmith.eval.prompts.sets import load_prompts
from draftsmith.models.features import target_features
from draftsmith.models.peagle import peagle_loss
from draftsmith.registry import get_spec
from draftsmith.serving.serve_check import prompt_token_ids
from draftsmith.target.load import load_target

VOCAB = 1024
SETTINGS = {"draft_vocab_size": VOCAB, "num_depths": 3, "mask_token_id": 16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    target = load_target("smollm2-135m-instruct", dtype="float32")
    model = target.model
    prompts = [p for name in ("mt_bench", "humaneval", "gsm8k")
               for p in load_prompts(name, limit=args.limit)]
    rows = []
    for ids in prompt_token_ids(target.tokenizer, prompts):
        answer = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens,
                                do_sample=False)[0].tolist()
        rows.append((answer, len(ids)))
    width = max(len(r) for r, _ in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention, loss_mask = torch.zeros_like(input_ids), torch.zeros_like(input_ids)
    for i, (tokens, start) in enumerate(rows):
        input_ids[i, :len(tokens)] = torch.tensor(tokens)
        attention[i, :len(tokens)] = 1
        loss_mask[i, start:len(tokens)] = 1
    spec = get_spec("peagle")
    torch.manual_seed(0)
    module = spec.build(model.config, spec.make_config(SETTINGS))
    used = sorted(set(input_ids[attention.bool()].tolist()))
    used += [i for i in range(model.config.vocab_size) if i not in set(used)][:VOCAB - len(used)]
    used = torch.tensor(sorted(used))
    module.set_draft_vocab(used - torch.arange(VOCAB), torch.zeros(
        model.config.vocab_size, dtype=torch.bool).index_fill(0, used, True))
    module.init_from_target(model)
    features = target_features(model, input_ids, attention, loss_mask,
                               spec.aux_layers(model.config.num_hidden_layers, module.config))
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=3e-3,
                                  betas=(0.9, 0.95))
    for step in range(args.steps):
        loss, metrics = peagle_loss(module, input_ids, attention, loss_mask,
                                    features.aux_hidden, features)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == args.steps - 1:
            accs = " ".join(f"{metrics[f'acc_{d}']:.2f}" for d in range(3))
            print(f"step {step} loss {loss.item():.3f} acc by depth {accs}", flush=True)
    tensors = {k: v.contiguous() for k, v in module.state_dict().items()
               if not k.startswith("rotary.")}
    meta = {"kind": "peagle", "drafter_config": asdict(module.config),
            "target": "smollm2-135m-instruct", "target_config": model.config.to_dict(),
            "aux_layers": list(module.layer_ids), "training_steps": args.steps,
            "num_processes": 1, "lora": False, "eval": {},
            "recipe": {"target": {"name": "smollm2-135m-instruct"},
                       "drafter": {"kind": "peagle", **SETTINGS},
                       "train": {"optimizer": "adamw", "lr": 3e-3, "max_steps": args.steps}}}
    write_drafter_folder(args.out / "drafter", tensors, meta)


if __name__ == "__main__":
    main()
