"""Fingerprints of a target and its tokenizer, stored with generated data so that it is never used
with a different model or vocabulary than it was made with."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

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


def text_sha256(text: str) -> str:
    """Hash of a text (e.g. a chat template)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TargetIdentity:
    """Who made a dataset: the model's name or path, its config hash and its vocabulary hash."""

    name_or_path: str
    config_sha256: str
    vocab_sha256: str

    @classmethod
    def of(cls, model, tokenizer) -> TargetIdentity:
        """The identity of a loaded model and tokenizer (`model.name_or_path`)."""
        return cls(str(model.name_or_path), config_sha256(model.config), vocab_sha256(tokenizer))

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """Short form for messages: name, config and vocab hash prefixes."""
        return (f"{self.name_or_path or '<unnamed>'} (config {self.config_sha256[:12]}, "
                f"vocab {self.vocab_sha256[:12]})")
