"""A causal LM with its KV cache: forward a tree of new tokens, then keep only the accepted ones.

The cache holds a committed prefix of length `length`. `forward` appends n new tokens at given
positions with a tree mask over them (everything committed stays visible). `commit` keeps a subset
of the uncommitted entries, in order, and drops the rest, so accepted tree nodes that are not
contiguous need no recomputation.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from draftsmith.decoding.few_row_linear import install_few_row_linear
from draftsmith.errors import DraftsmithError


@dataclass
class ForwardOutput:
    """Logits (k, V) for the kept positions, the last hidden state (n, H) (after the final norm)
    of every new token, and every layer's hidden states when asked: tuple of (n, H)."""

    logits: torch.Tensor
    last_hidden: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


class CausalLMRunner:
    """Runs a Hugging Face causal LM on a growing KV cache with tree attention and rollback.

    Args:
        model: any transformers causal LM with full attention (Llama, Qwen2, Mistral, ...).
        output_hidden_states: also return every layer's hidden states for the new tokens.
        few_row_linear: on a float32 CPU model, let its linears take the form measured fastest
            on this machine for forwards of a few tokens (see `few_row_linear.py`).
    """

    def __init__(self, model: torch.nn.Module, output_hidden_states: bool = False,
                 few_row_linear: bool = True):
        from transformers import DynamicCache

        self.model = model
        # The decoder and head are called separately: the head then sees a 2D (n, H) input.
        # (PyTorch's CPU bf16 linear is ~30x slower on a strided 3D slice such as the one
        # `logits_to_keep` produces.)
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.output_hidden_states = output_hidden_states
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        if few_row_linear:
            install_few_row_linear(model)
        params = inspect.signature(self.decoder.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._cache_cls = DynamicCache
        self.cache = None
        self.length = 0  # committed entries
        self.pending = 0  # entries appended since the last commit
        config = model.config
        layer_types = getattr(config, "layer_types", None)
        if layer_types is not None:
            sliding = any("sliding" in str(t) for t in layer_types)
        else:
            sliding = bool(getattr(config, "sliding_window", None)) and getattr(
                config, "use_sliding_window", True)
        if sliding:
            raise DraftsmithError(
                f"{config.model_type} uses sliding-window attention, whose cache cannot be rolled "
                "back node by node yet; use a full-attention target"
            )

    def reset(self) -> None:
        """Forget everything: the next forward starts a new sequence."""
        self.cache = self._cache_cls(config=self.model.config)
        self.length = 0
        self.pending = 0

    def additive_mask(self, visible: torch.Tensor) -> torch.Tensor:
        """A bool mask (True = visible) as the float mask the model adds to attention scores."""
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~visible, torch.finfo(self.dtype).min)

    def head(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) from last hidden states (..., H), softcapped where the model is."""
        logits = self.lm_head(last_hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def decode(self, cache, input_ids: torch.Tensor, position_ids: torch.Tensor,
               attention_mask: torch.Tensor | None = None):
        """One decoder call appending (B, n) tokens to `cache` (the model's own output object).

        `attention_mask`: (B, 1, n, past + n) additive float mask; None = plain causal."""
        kwargs = {self._cache_kwarg: cache}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        return self.decoder(input_ids=input_ids.to(self.device),
                            position_ids=position_ids.to(self.device), use_cache=True,
                            output_hidden_states=self.output_hidden_states, **kwargs)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> ForwardOutput:
        """Append `tokens` after the committed prefix and any pending entries.

        Args:
            tokens: (n,) token ids.
            position_ids: (n,) absolute positions; default continues the sequence causally.
            tree_mask: (n, pending + n) bool over the uncommitted region (pending entries then the
                new tokens); True = visible. None means plain causal attention.
            logits_to_keep: compute logits only for the last k tokens (0 = all).

        Returns:
            ForwardOutput for the kept positions.
        """
        if self.cache is None:
            self.reset()
        n = tokens.shape[0]
        start = self.length + self.pending
        if position_ids is None:
            position_ids = torch.arange(start, start + n, device=self.device)
        mask = None
        if tree_mask is not None:
            full = torch.ones(n, start + n, dtype=torch.bool, device=self.device)
            full[:, self.length:] = tree_mask
            mask = self.additive_mask(full)[None, None]
        out = self.decode(self.cache, tokens[None], position_ids[None], mask)
        self.pending += n
        last = out.last_hidden_state[0]
        logits = self.head(last[-logits_to_keep:] if logits_to_keep else last)
        hidden = None
        if self.output_hidden_states:
            hidden = tuple(h[0] for h in out.hidden_states)
        return ForwardOutput(logits=logits, last_hidden=last, hidden_states=hidden)

    @torch.inference_mode()
    def commit(self, keep: list[int] | None = None) -> None:
        """Keep the uncommitted entries at indices `keep` (increasing; None = all), drop the rest."""
        if keep is None:
            keep_count = self.pending
        else:
            keep_count = len(keep)
            if keep != list(range(keep_count)):
                index = torch.tensor(keep, dtype=torch.long, device=self.device) + self.length
                for layer in self.cache.layers:
                    layer.keys[..., self.length:self.length + keep_count, :] = \
                        layer.keys.index_select(-2, index)
                    layer.values[..., self.length:self.length + keep_count, :] = \
                        layer.values.index_select(-2, index)
        self.length += keep_count
        self.pending = 0
        self._truncate(self.length)

    def rollback(self) -> None:
        """Drop every uncommitted entry."""
        self.pending = 0
        self._truncate(self.length)

    def _truncate(self, size: int) -> None:
        for layer in self.cache.layers:
            if layer.keys is not None and layer.keys.shape[-2] > size:
                layer.keys = layer.keys[..., :size, :]
                layer.values = layer.values[..., :size, :]
