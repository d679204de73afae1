"""Fingerprints of a target and its tokenizer, stored with generated data so that it is never used
with a different model or vocabulary than it was made with.

The weights are fingerprinted cheaply: for a model loaded from a folder, each weight file's size,
safetensors header and 64 evenly spaced 4 KiB blocks (new weights saved into the same folder
change them; a few MB are read however large the model); for a model without files (built in
memory, or from the Hub cache), a strided sample of every tensor rounded to bfloat16, so a float32
and a bfloat16 load of the same weights agree.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# Config entries that change how a model runs, not what it computes.
RUNTIME_CONFIG_KEYS = frozenset({
    "transformers_version", "dtype", "torch_dtype", "use_cache", "output_hidden_states",
    "output_attentions", "return_dict",
})


def _sha256(payload) -> str:
    text = json.dumps(payload, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_sha256(config) -> str:
    """Hash of a model config without its runtime-only and private (`_name_or_path`) entries."""
    values = {k: v for k, v in config.to_dict().items()
              if k not in RUNTIME_CONFIG_KEYS and not k.startswith("_")}
    return _sha256(values)


def vocab_sha256(tokenizer) -> str:
    """Hash of the token -> id map, added tokens included."""
    return _sha256(sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SAMPLED_BLOCKS = 64
BLOCK_BYTES = 4096
MAX_HEADER_BYTES = 16 << 20
SAMPLED_VALUES = 256


def file_fingerprint(path: Path) -> str:
    """Hash of a weight file's size, header (the whole safetensors header, else the first 64 KiB)
    and `SAMPLED_BLOCKS` evenly spaced blocks: a few MB read, whatever the file's size."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        head = handle.read(8)
        header = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        if path.suffix != ".safetensors" or header > MAX_HEADER_BYTES:
            header = 1 << 16
        digest.update(head + handle.read(header))
        for k in range(SAMPLED_BLOCKS + 1):
            handle.seek(max(0, (size - BLOCK_BYTES) * k // SAMPLED_BLOCKS))
            digest.update(handle.read(BLOCK_BYTES))
    return digest.hexdigest()


def _tensor_sample(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().reshape(-1)
    if flat.numel() > SAMPLED_VALUES:
        # evenly spaced, in integers: float32 positions round past the end above 2**24 values
        steps = torch.arange(SAMPLED_VALUES, device=flat.device)
        index = steps * (flat.numel() - 1) // (SAMPLED_VALUES - 1)
        flat = flat[index]
    if flat.is_floating_point():
        flat = flat.to(torch.bfloat16).float()
    return flat.cpu().numpy().tobytes()


def weights_sha256(model) -> str:
    """Fingerprint of a model's weights: of its weight files when it was loaded from a folder
    that holds them, else of a sample of its tensors (see the module docstring)."""
    name = str(getattr(model, "name_or_path", "") or "")
    folder = Path(name)
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
                   ) if name and folder.is_dir() else []
    if files:
        return _sha256({p.name: file_fingerprint(p) for p in files})
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(f"{key}{tuple(tensor.shape)}".encode())
        digest.update(_tensor_sample(tensor))
    return digest.hexdigest()


def text_sha256(text: str) -> str:
    """Hash of a text (e.g. a chat template)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TargetIdentity:
    """Who made a dataset: the model's name or path, its config, vocabulary and weights hashes
    (`weights_sha256` is empty in data made before it was recorded: such data never matches)."""

    name_or_path: str
    config_sha256: str
    vocab_sha256: str
    weights_sha256: str = ""

    @classmethod
    def of(cls, model, tokenizer) -> TargetIdentity:
        """The identity of a loaded model and tokenizer (`model.name_or_path`)."""
        return cls(str(model.name_or_path), config_sha256(model.config), vocab_sha256(tokenizer),
                   weights_sha256(model))

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """Short form for messages: name, config, vocab and weights hash prefixes."""
        return (f"{self.name_or_path or '<unnamed>'} (config {self.config_sha256[:12]}, "
                f"vocab {self.vocab_sha256[:12]}, weights {self.weights_sha256[:12] or 'unknown'})")
