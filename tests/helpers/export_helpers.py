"""Helpers for export tests: trained-looking drafters of every kind for tiny targets, written in
draftsmith's own training-output format, and a decoder that records every proposed tree."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftsmith.decoding.decode import generate
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.drafter_folder import DRAFTER_CONFIG, WEIGHTS, LoadedDrafter
from draftsmith.eval.methods import make_drafter_proposer
from draftsmith.eval.settings import DecodeSettings
from draftsmith.registry import get_spec
from tests.helpers.tiny_targets import tiny_target

TARGET_NAME = "test-org/tiny-target"
# Settings per kind; EAGLE-3 gets distinct increasing layer ids (the default for 4 layers repeats).
SETTINGS = {
    "eagle3": {"draft_vocab_size": 100, "layer_ids": [0, 1, 2]},
    "eagle1": {},
    "medusa": {"num_heads": 3, "num_layers": 1},
    "mtp": {"num_modules": 2},
    "dflash": {"block_size": 4, "num_layers": 2},
    "dspark": {"block_size": 3, "num_layers": 2, "markov_rank": 8},
}
# Export formats per drafter kind.
KIND_OF_FORMAT = {"eagle3": "eagle3", "speculators": "eagle3", "eagle": "eagle1",
                  "medusa": "medusa", "mtp": "mtp", "dflash": "dflash",
                  "dflash-speculators": "dflash", "dspark": "dspark"}


def build_drafter(kind: str, target, settings: dict | None = None) -> torch.nn.Module:
    """A random drafter whose weights are sharpened so its trees vary from step to step; one with
    a reduced draft vocabulary (EAGLE-3, DFlash with draft_vocab_size) gets a random
    (non-identity) one."""
    spec = get_spec(kind)
    torch.manual_seed(1)
    module = spec.build(target.config, spec.make_config(SETTINGS[kind] if settings is None
                                                        else settings))
    vocab = target.config.vocab_size
    if kind in ("eagle3", "dflash") and module.draft_vocab_size < vocab:
        draft = module.draft_vocab_size
        used = torch.randperm(vocab, generator=torch.Generator().manual_seed(2))[:draft].sort().values
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[used] = True
        module.set_draft_vocab(used - torch.arange(draft), t2d)
    module.init_from_target(target)
    if hasattr(module, "markov_head"):  # DSpark's W2 starts at zero: give the round trip a bias
        torch.nn.init.normal_(module.markov_head.markov_w2.weight, std=0.5)
    for param in module.parameters():
        if param.requires_grad and param.dim() == 2:
            param.data *= 4
    return module.eval().requires_grad_(False)


def write_checkpoint(folder: Path, kind: str, module: torch.nn.Module, target,
                     settings: dict | None = None, training_steps: int = 7) -> Path:
    """What `draftsmith train` writes to OUTPUT_DIR/drafter (see train/checkpoint.py)."""
    settings = SETTINGS[kind] if settings is None else settings
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in module.state_dict().items()
               if not k.startswith("rotary.")}
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})
    spec = get_spec(kind)
    config = asdict(spec.make_config(settings))
    meta = {
        "kind": kind,
        "drafter_config": config,
        "target": TARGET_NAME,
        "target_config": target.config.to_dict(),
        "aux_layers": list(spec.aux_layers(target.config.num_hidden_layers,
                                           spec.make_config(settings))),
        "training_steps": training_steps,
        "num_processes": 1,
        "lora": False,
        "eval": {},
        "recipe": {"target": {"name": TARGET_NAME}, "drafter": {"kind": kind, **settings},
                   "data": {"source": "sharegpt", "limit": 8,
                            "regenerate": {"temperature": 0.0, "max_new_tokens": 32}},
                   "train": {"lr": 1e-4, "batch_size": 2, "max_steps": training_steps}},
    }
    (folder / DRAFTER_CONFIG).write_text(json.dumps(meta, indent=2, default=str))
    return folder


class TreeRecorder:
    """Wraps a proposer and records every proposed tree (tokens and parents)."""

    def __init__(self, inner):
        self.inner, self.name, self.trees = inner, inner.name, []
        self.needs_hidden_states = inner.needs_hidden_states

    def reset(self, context, target_out):
        self.inner.reset(context, target_out)

    def propose(self, root, max_depth):
        tree = self.inner.propose(root, max_depth)
        self.trees.append((tree.tokens.tolist(), tree.parents.tolist()))
        return tree

    def observe(self, path_tokens, target_out, path):
        self.inner.observe(path_tokens, target_out, path)


def decode_with(target, drafter: LoadedDrafter, prompt: list[int], new_tokens: int = 24):
    """Greedy speculative decoding with the kind's default tree; returns (result, trees)."""
    settings = DecodeSettings(tree_topk=3, tree_depth=4, tree_total_tokens=10)
    recorder = TreeRecorder(make_drafter_proposer("drafter", drafter, settings))
    result = generate(CausalLMRunner(target, output_hidden_states=True), recorder, prompt,
                      new_tokens)
    return result, recorder.trees


def plain_greedy(target, prompt: list[int], new_tokens: int = 24) -> list[int]:
    return target.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()


def make_checkpoint(tmp_path: Path, kind: str, family: str = "llama", settings: dict | None = None,
                    **target_overrides):
    """A tiny target, a drafter of `kind` for it, and its draftsmith folder under tmp_path:
    (target, drafter module, checkpoint folder)."""
    target = tiny_target(family, **target_overrides)
    module = build_drafter(kind, target, settings)
    folder = write_checkpoint(tmp_path / f"{kind}-{family}" / "drafter", kind, module, target,
                              settings)
    return target, module, folder


PROMPT = torch.randint(2, 128, (16,), generator=torch.Generator().manual_seed(3)).tolist()
