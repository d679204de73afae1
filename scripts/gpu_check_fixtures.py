"""What scripts/gpu_check.py runs on, built on the machine in seconds (a lent GPU has no model hub):
a tiny random Llama target and a draft model saved as folders with a character tokenizer, and a
random drafter of every registered kind and variant in draftsmith's drafter folder format, with
the `draftsmith eval --check-lossless` arguments over all of them.

The test suite keeps its own copies of these builders (tests/helpers/); this module is the
script's, so that nothing outside tests/ imports tests/.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

PROMPTS = "Hi!\nName a colour.\nOk\n"
# a 4-layer Llama of width 32 over a 128-token character vocabulary (bos/pad 0, eos 1)
TINY = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "eos_token_id": 1, "bos_token_id": 0, "pad_token_id": 0}
# the fewest heads / modules / TTT steps that still exercise every code path of a kind; a kind
# without an entry is built with its defaults, so a new kind is checked without editing this
SMALL = {"medusa": {"num_heads": 2}, "mtp": {"num_modules": 2},
         "eagle3": {"draft_vocab_size": 96, "ttt_steps": 2},
         "dflash": {"block_size": 4, "num_layers": 1, "anchors_per_sequence": 8},
         "dspark": {"block_size": 3, "num_layers": 1, "anchors_per_sequence": 8,
                    "markov_rank": 8}}
# settings that change what a kind computes, each gated as a drafter of its own
VARIANTS = {"medusa": {"shared_head": {"shared_head": True}},
            "eagle3": {"eagle3.1": {"fc_norm": True, "norm_output": True}},
            "dflash": {"draft-vocab": {"draft_vocab_size": 96}}}
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")


def tiny_target(seed: int = 0):
    """A frozen tiny random Llama in eval mode, the same for a given seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY)).eval().requires_grad_(False)


def char_tokenizer():
    """One token per character (printable ASCII and newline), 128 ids, ChatML special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_end|>", "<|im_start|>"]  # ids 0 (bos/pad), 1 (eos), 2
    chars = ["\n", *(chr(c) for c in range(32, 127))]
    filler = [chr(0xC0 + k) for k in range(128 - len(specials) - len(chars))]
    vocab = {token: i for i, token in enumerate(specials + chars + filler)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|endoftext|>"))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_target_and_draft(root: Path):
    """The tiny target in `root/target` and a draft model (another seed, same shapes) in
    `root/draft`, each with the character tokenizer; returns the target."""
    target = tiny_target(0)
    for folder, model in ((root / "target", target), (root / "draft", tiny_target(1))):
        model.save_pretrained(folder)
        char_tokenizer().save_pretrained(folder)
    return target


def random_drafter(kind: str, target, settings: dict) -> torch.nn.Module:
    """A random drafter of `kind` for `target`, its weights sharpened so that its trees vary from
    step to step; a reduced draft vocabulary gets a random (non-identity) set of tokens."""
    from draftsmith.registry import get_spec

    spec = get_spec(kind)
    torch.manual_seed(1)
    module = spec.build(target.config, spec.make_config(settings))
    vocab = target.config.vocab_size
    draft = module.draft_vocab_size if spec.uses_draft_vocab else vocab
    if draft < vocab:
        used = torch.randperm(vocab, generator=torch.Generator().manual_seed(2))[:draft].sort()[0]
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[used] = True
        module.set_draft_vocab(used - torch.arange(draft), t2d)
    module.init_from_target(target)
    if hasattr(module, "markov_head"):  # DSpark's W2 starts at zero: give its round trip a bias
        torch.nn.init.normal_(module.markov_head.markov_w2.weight, std=0.5)
    for param in module.parameters():
        if param.requires_grad and param.dim() == 2:
            param.data *= 4
    return module.eval().requires_grad_(False)


def write_drafter(folder: Path, kind: str, module: torch.nn.Module, target,
                  settings: dict) -> Path:
    """`module` as the drafter folder `draftsmith train` writes (see drafter_folder.py)."""
    from draftsmith.drafter_folder import write_drafter_folder
    from draftsmith.registry import get_spec

    spec = get_spec(kind)
    config = spec.make_config(settings)
    tensors = {k: v.contiguous() for k, v in module.state_dict().items()
               if not k.startswith("rotary.")}
    meta = {"kind": kind, "drafter_config": asdict(config), "target": str(folder),
            "target_config": target.config.to_dict(),
            "aux_layers": list(spec.aux_layers(target.config.num_hidden_layers, config)),
            "training_steps": 0, "num_processes": 1, "lora": False, "eval": {},
            "recipe": {"drafter": {"kind": kind, **settings}}}
    folder.parent.mkdir(parents=True, exist_ok=True)
    return write_drafter_folder(folder, tensors, meta)


def every_kind_gate(root: Path) -> tuple[Path, Path, list[str], list[str]]:
    """(root, prompt file, --drafter arguments, methods) with a random drafter of every kind and
    variant under root, each decoded with its default tree, its chain where it has one and
    inside the prompt-lookup hybrid."""
    from draftsmith.registry import DRAFTERS

    target = save_target_and_draft(root)
    drafter_args, methods = [], ["plain", "prompt_lookup", "draft_model"]
    drafters = [(kind, kind, dict(SMALL.get(kind, {}))) for kind in DRAFTERS]
    drafters += [(kind, f"{kind}-{name}".replace(".", ""), {**SMALL.get(kind, {}), **extra})
                 for kind, variants in VARIANTS.items() if kind in DRAFTERS
                 for name, extra in variants.items()]
    for kind, label, settings in drafters:
        folder = write_drafter(root / label / "drafter", kind,
                               random_drafter(kind, target, settings), target, settings)
        drafter_args += ["--drafter", f"{label}={folder}"]
        methods += [f"drafter@{label}", f"drafter_lookup@{label}"]
        spec = DRAFTERS[kind]
        if "chain" in spec.tree_shapes and spec.default_tree != "chain":
            methods.append(f"drafter_chain@{label}")
    prompts = root / "prompts.txt"
    prompts.write_text(PROMPTS)
    return root, prompts, drafter_args, methods


def gate_args(setup, out: Path, methods: list[str] | None = None,
              extra: tuple[str, ...] = ()) -> list[str]:
    """`draftsmith eval` arguments of the float32 greedy gate at batch sizes 1 and 2."""
    root, prompts, drafter_args, all_methods = setup
    return ["eval", "--target", str(root / "target"), "--draft-model", str(root / "draft"),
            "--prompts", str(prompts), "--max-new-tokens", "10", "--num-draft-tokens", "3",
            "--tree-depth", "3", "--tree-total-tokens", "6", "--batch-size", "1,2",
            "--methods", ",".join(methods or all_methods), *drafter_args, "--check-lossless",
            "--out", str(out), *extra]
