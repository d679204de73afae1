"""Which targets a drafter kind can be trained on and decode with: the config fields it reads of
the target (`DrafterSpec.target_fields` in the registry) and a decoder that keeps its layers as a
`layers` list (the hidden-state hooks of `models/features.py`). Checked when the target is loaded,
before any data is prepared, so an unsupported architecture (GPT-2) is named at once instead of
failing with an AttributeError after the data step.
"""

from __future__ import annotations

from torch import nn

from draftsmith.errors import DraftsmithError

# what `drafter_layer_config` mirrors in a drafter's decoder layer (EAGLE, MTP, DFlash, DSpark)
LAYER_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_hidden_layers")
# what heads on the last hidden state read (Medusa)
HEAD_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers")
SUPPORTED = ("Llama-style decoder targets (model types llama, mistral, qwen2, qwen3 and the "
             "like; tested: Llama/SmolLM2 and Qwen2)")


def _architecture(config) -> str:
    names = getattr(config, "architectures", None) or []
    model_type = getattr(config, "model_type", None) or "?"
    return f"{model_type} ({', '.join(names)})" if names else model_type


def unsupported_target(config, fields: tuple[str, ...], decoder: nn.Module | None = None
                       ) -> str | None:
    """Why a target with `config` (and, when given, the loaded model's `decoder`) cannot serve a
    drafter reading `fields`, or None when it can."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    missing = [name for name in fields if getattr(text, name, None) is None]
    problems = []
    if missing:
        problems.append(f"its config has no {', '.join(missing)}")
    if decoder is not None and not isinstance(getattr(decoder, "layers", None), nn.ModuleList):
        problems.append(f"its decoder ({type(decoder).__name__}) keeps no `layers` list to read "
                        "hidden states from")
    if not problems:
        return None
    return f"a {_architecture(text)} target is not supported: {' and '.join(problems)}"


def check_target_supported(title: str, fields: tuple[str, ...], config,
                           decoder: nn.Module | None = None, target: str = "the target") -> None:
    """Refuse a target a `title` drafter cannot be built for or read hidden states of.

    Args:
        title: the kind's display name (EAGLE-3).
        fields: the config fields its drafter reads (`DrafterSpec.target_fields`).
        config: the target's config.
        decoder: the loaded target's decoder (`model.get_decoder()`), when loaded.
        target: how the message names the target (its spec).

    Raises:
        DraftsmithError: naming the architecture, what it lacks and the supported ones.
    """
    why = unsupported_target(config, fields, decoder)
    if why is not None:
        raise DraftsmithError(f"{title} drafters cannot use {target}: {why}. {title} supports "
                              f"{SUPPORTED}; pick such a target (`draftsmith models list` names "
                              "the offline ones)")
