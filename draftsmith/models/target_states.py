"""The frozen target's hidden states: their indices and storage keys, and the one function that
computes them (`extract_features`), used online by the training step and offline by the cache
builder, so the two paths compute the same tensors.

Indices are into transformers' `hidden_states` tuple (`output_hidden_states=True`): index 0 is the
embedding output, index i the output of layer i-1, and index N (the last, N = number of layers)
is taken after the final norm, so `lm_head(hidden_states[N]) == logits`. Features are stored and
returned under the key `hidden_states.{index}`.

`hidden_indices` is the one place that turns a drafter's 0-based layer outputs into these
indices; which layers a kind reads is the registry's (`DrafterSpec.aux_layers`): Medusa, EAGLE-1/2
and MTP read only the last hidden state; EAGLE-3 fuses the layer outputs `[1, N//2-1, N-4]`
(indices `[2, N//2, N-3]`) or its recipe's `layer_ids`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.models.masks import document_causal_mask
from draftsmith.models.target_support import SUPPORTED, unsupported_target


def hidden_key(index: int) -> str:
    """Storage key of `hidden_states[index]`."""
    return f"hidden_states.{index}"


def hidden_indices(num_layers: int, aux_layers: Iterable[int]) -> tuple[int, ...]:
    """The `hidden_states` indices of 0-based layer outputs `aux_layers` plus the last (post-norm)
    state, sorted, the last state last (layer i's output is index i + 1; index N is the last).

    Args:
        num_layers: N, the target's number of decoder layers.
        aux_layers: 0-based layer outputs a drafter reads besides the last hidden state.
    """
    return (*sorted({i + 1 for i in aux_layers} - {num_layers}), num_layers)


def num_decoder_layers(model) -> int:
    """N of a causal LM (its text config's `num_hidden_layers`)."""
    return int(model.config.get_text_config().num_hidden_layers)


def decoder_mask(model, attention_mask: torch.Tensor, documents: torch.Tensor | None = None
                 ) -> torch.Tensor | None:
    """The mask the target's decoder gets: under SDPA none, so transformers runs causal
    attention without a mask (`is_causal`, which skips the blocks above the diagonal): with
    right padding every real query's keys are real tokens, so its state is the one the
    padding-aware mask gives (bitwise, measured; only padded positions, which nothing reads,
    differ), at 5-7% less time per forward on a 2-core Xeon (bf16, 4 x 370 tokens). Given the
    (B, T) mask, transformers would first ask the device whether any token is padded (two host
    reads per forward, `masking_utils._ignore_causal_mask_sdpa`). Other attention
    implementations get the (B, T) mask. Packed rows (`documents`, `train/packing.py`) get the
    (B, 1, T, T) mask of each document (`document_causal_mask`): boolean under SDPA, additive
    (0 or the dtype's lowest) under the others, as transformers applies a 4-D mask as given."""
    implementation = getattr(model.config, "_attn_implementation", None)
    sdpa = implementation == "sdpa"
    if documents is not None:
        if implementation not in ("sdpa", "eager"):
            raise DraftsmithError(
                f"train.batching=packed gives the target a per-document attention mask, which its "
                f"attention implementation {implementation!r} does not take here (sdpa and eager "
                "do); load the target with sdpa, or use train.batching: tokens")
        mask = document_causal_mask(documents)
        if sdpa:
            return mask
        dtype = model.dtype  # the compute dtype, also of a quantized model
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min)
    return None if sdpa else attention_mask


# the hooks below are the layers' own, so two forwards at once (training's next batch on its
# thread, `train.overlap_target`, and an evaluation) would read each other's states: one at a time
_HOOKED = threading.Lock()


@torch.no_grad()  # not inference_mode: online training feeds these tensors to autograd
def extract_features(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer_ids: Sequence[int],
    documents: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Selected hidden states of the frozen target, without computing logits; only those are
    kept while the decoder runs (forward hooks on the layers that produce them).

    Args:
        model: a transformers causal LM whose decoder (`get_decoder()`) runs `layers` in order
            and returns the final-norm state as `last_hidden_state`.
        input_ids: (B, T) token ids; right padding keeps real tokens' states independent of it.
        attention_mask: (B, T) 1 on real tokens.
        layer_ids: `hidden_states` indices (see the module docstring), each in [0, N].
        documents, position_ids: (B, T) of packed rows (`train/packing.py`): each document
            attends to itself alone, at its own positions; None = one sequence per row.

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
    decoder = model.get_decoder()
    why = unsupported_target(model.config, (), decoder)
    if why is not None:
        raise DraftsmithError(f"cannot read hidden states of the target: {why}. draftsmith "
                              f"supports {SUPPORTED}; use such a target")
    layers = decoder.layers
    kept: dict[str, torch.Tensor] = {}

    def keep_input(index):  # hidden_states[0]: what the first layer is fed
        def hook(module, args, kwargs):
            kept[hidden_key(index)] = args[0] if args else kwargs["hidden_states"]
        return hook

    def keep_output(index):  # hidden_states[i]: layer i - 1's output
        def hook(module, args, output):
            kept[hidden_key(index)] = output[0] if isinstance(output, tuple) else output
        return hook

    # only the requested states are held, not all N + 1 as `output_hidden_states` would
    with _HOOKED:
        handles = [layers[0].register_forward_pre_hook(keep_input(0), with_kwargs=True)
                   if i == 0 else layers[i - 1].register_forward_hook(keep_output(i))
                   for i in sorted(set(layer_ids)) if i < num_layers]
        try:
            outputs = decoder(input_ids=input_ids,
                              attention_mask=decoder_mask(model, attention_mask, documents),
                              position_ids=position_ids, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
    if num_layers in layer_ids:  # after the final norm
        kept[hidden_key(num_layers)] = outputs.last_hidden_state
    return {hidden_key(i): kept[hidden_key(i)] for i in sorted(set(layer_ids))}
