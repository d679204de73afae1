"""Which target hidden states each drafter kind reads, and the one function that computes them.

Indices are into transformers' `hidden_states` tuple (`output_hidden_states=True`): index 0 is the
embedding output, index i the output of layer i-1, and index N (the last, N = number of layers)
is taken after the final norm, so `lm_head(hidden_states[N]) == logits`. Features are stored and
returned under the key `hidden_states.{index}`.

Which indices a kind reads is the registry's (`DrafterSpec.hidden_indices`): Medusa, EAGLE-1/2
and MTP read only the last hidden state; EAGLE-3 fuses the layer outputs `[1, N//2-1, N-4]`
(indices `[2, N//2, N-3]`) or its recipe's `layer_ids`. Every loss needs the target
distribution, which is recomputed from the last hidden state with the frozen `lm_head` rather
than stored (a V-sized row per token would dwarf everything else).

`extract_features` is used online by the training step and offline by the cache builder, so the
two paths compute the same tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.registry import DRAFTERS, get_spec

FEATURE_KINDS = tuple(DRAFTERS)


def hidden_key(index: int) -> str:
    """Storage key of `hidden_states[index]`."""
    return f"hidden_states.{index}"


def layers_for_kind(kind: str, num_layers: int) -> tuple[int, ...]:
    """The `hidden_states` indices a drafter kind reads with its default settings, the last
    (post-norm) state last.

    Args:
        kind: a registered kind (`FEATURE_KINDS`).
        num_layers: N, the target's number of decoder layers.

    Raises:
        DraftsmithError: unknown kind (lists the choices).
    """
    return get_spec(kind).hidden_indices(num_layers)


def layers_for_kinds(kinds: Iterable[str], num_layers: int) -> tuple[int, ...]:
    """Sorted union of `layers_for_kind` over several kinds (what one cache must hold)."""
    return tuple(sorted({i for kind in kinds for i in layers_for_kind(kind, num_layers)}))


def num_decoder_layers(model) -> int:
    """N of a causal LM (its text config's `num_hidden_layers`)."""
    return int(model.config.get_text_config().num_hidden_layers)


@torch.no_grad()  # not inference_mode: online training feeds these tensors to autograd
def extract_features(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer_ids: Sequence[int]
) -> dict[str, torch.Tensor]:
    """Selected hidden states of the frozen target, without computing logits.

    Args:
        model: a transformers causal LM (its decoder is run with `output_hidden_states=True`).
        input_ids: (B, T) token ids; right padding keeps real tokens' states independent of it.
        attention_mask: (B, T) 1 on real tokens.
        layer_ids: `hidden_states` indices (see the module docstring), each in [0, N].

    Returns:
        `{"hidden_states.{i}": (B, T, H)}` in the model's dtype.

    Raises:
        DraftsmithError: an index outside [0, N].
    """
    num_layers = num_decoder_layers(model)
    bad = [i for i in layer_ids if not 0 <= i <= num_layers]
    if bad:
        raise DraftsmithError(f"hidden-state indices {bad} are outside [0, {num_layers}] for a "
                              f"target with {num_layers} layers")
    outputs = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                  output_hidden_states=True, use_cache=False)
    return {hidden_key(i): outputs.hidden_states[i] for i in sorted(set(layer_ids))}
