"""A causal LM decoding several sequences of different lengths in one KV cache (chains only).

Row b's committed entries are the cache slots [0, L_b): slot j holds position j, so a row's
positions are its slot indices. Every forward appends the same number n of slots to every row
(shorter chains are padded); committing keeps the first `keep[b]` of row b's new slots, moves them
down to [L_b, L_b + keep[b]) and cuts the cache to the longest row. Slots at or past L_b are dead
for row b: the attention mask hides them, so rows that accepted different numbers of tokens (or
started from prompts of different lengths) each see exactly their own sequence.
"""

from __future__ import annotations

import torch

from draftsmith.decoding.runner import CausalLMRunner, ForwardOutput


class BatchedLMRunner:
    """Prefill a batch, forward (B, n) chain blocks, commit per-row counts, drop finished rows.

    Args:
        model: as `CausalLMRunner` (whose decoder call, head and mask it uses).
        output_hidden_states: also return every layer's hidden states for the new tokens.
    """

    def __init__(self, model: torch.nn.Module, output_hidden_states: bool = False):
        self.single = CausalLMRunner(model, output_hidden_states=output_hidden_states)
        self.device = self.single.device
        self.cache = None
        self.lengths: list[int] = []  # committed slots per row
        self._past = 0  # cache slots before the last forward

    @property
    def size(self) -> int:
        """Slots in the cache (every row has this many, the dead ones included)."""
        layer = self.cache.layers[0] if self.cache is not None and self.cache.layers else None
        return 0 if layer is None or layer.keys is None else layer.keys.shape[-2]

    @torch.inference_mode()
    def prefill(self, contexts: list[list[int]], pad_token_id: int = 0) -> list[ForwardOutput]:
        """Start a new batch: forward and commit every row's context.

        Args:
            contexts: one token list per row (may be empty).
            pad_token_id: filler of the shorter rows (never visible to real tokens).

        Returns:
            Per row, what a single-sequence prefill returns: logits (1, V) at its last token, last
            hidden states and every layer's hidden states of its tokens; an empty row gets empty
            logits and no hidden states.
        """
        self.single.reset()
        self.cache = self.single.cache
        self.lengths = [0] * len(contexts)
        longest = max(len(c) for c in contexts)
        if longest == 0:
            return [ForwardOutput(logits=torch.empty(0, device=self.device)) for _ in contexts]
        tokens = torch.tensor([c + [pad_token_id] * (longest - len(c)) for c in contexts],
                              dtype=torch.long, device=self.device)
        out = self.forward_chains(tokens, logits=False)
        self.commit([len(c) for c in contexts])
        outputs = []
        for row, context in enumerate(contexts):
            own = self.row_output(out, row, len(context))
            outputs.append(ForwardOutput(self.single.head(own.last_hidden[-1:]), own.last_hidden,
                                         own.hidden_states) if context
                           else ForwardOutput(logits=torch.empty(0, device=self.device)))
        return outputs

    @torch.inference_mode()
    def forward_chains(self, tokens: torch.Tensor, logits: bool = True) -> ForwardOutput:
        """Append a (B, n) block of chain tokens after each row's committed entries.

        Token i of row b sits at position L_b + i and sees the row's committed entries and the
        row's tokens 0..i.

        Returns:
            ForwardOutput of the whole block: logits (B, n, V) (empty when not `logits`), last
            hidden states (B, n, H), every layer's hidden states (B, n, H) when asked.
        """
        rows, n = tokens.shape
        self._past = past = self.size
        lengths = torch.tensor(self.lengths, device=self.device)
        slots = torch.arange(past, device=self.device)
        visible = torch.cat([
            (slots[None] < lengths[:, None])[:, None, :].expand(rows, n, past),
            torch.ones(n, n, dtype=torch.bool, device=self.device).tril().expand(rows, n, n),
        ], dim=-1)
        out = self.single.decode(self.cache, tokens,
                                 lengths[:, None] + torch.arange(n, device=self.device),
                                 self.single.additive_mask(visible)[:, None])
        last = out.last_hidden_state
        return ForwardOutput(
            logits=self.single.head(last) if logits else torch.empty(0, device=last.device),
            last_hidden=last,
            hidden_states=out.hidden_states if self.single.output_hidden_states else None)

    @staticmethod
    def row_output(out: ForwardOutput, row: int, n: int) -> ForwardOutput:
        """Row `row`'s first `n` positions of a block's output, as a single-sequence output."""
        return ForwardOutput(
            logits=out.logits[row, :n] if out.logits.numel() else out.logits,
            last_hidden=out.last_hidden[row, :n],
            hidden_states=None if out.hidden_states is None else
            tuple(h[row, :n] for h in out.hidden_states))

    @torch.inference_mode()
    def commit(self, keep: list[int]) -> None:
        """Keep the first `keep[b]` slots row b appended in the last forward; drop the rest."""
        past, total = self._past, self.size
        new_lengths = [length + k for length, k in zip(self.lengths, keep, strict=True)]
        size, low = max(new_lengths), min(self.lengths)
        if low < past:  # rows shorter than the cache: their kept slots move down to follow them
            j = torch.arange(low, size, device=self.device)[None]
            lengths = torch.tensor(self.lengths, device=self.device)[:, None]
            source = torch.where(j < lengths, j, past + j - lengths).clamp(max=total - 1)
            for layer in self.cache.layers:
                layer.keys = _take_slots(layer.keys, source, low)
                layer.values = _take_slots(layer.values, source, low)
        else:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., :size, :], layer.values[..., :size, :]
        self.lengths = new_lengths

    @torch.inference_mode()
    def keep_rows(self, rows: list[int]) -> None:
        """Go on with the rows at these indices only (finished rows leave the batch)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.lengths = [self.lengths[r] for r in rows]
        size = max(self.lengths)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[..., :size, :]
            layer.values = layer.values.index_select(0, index)[..., :size, :]


def _take_slots(cache: torch.Tensor, source: torch.Tensor, low: int) -> torch.Tensor:
    """(B, heads, S, D) cache -> its slots [0, low), then slot `source[b, i]` of each row b."""
    index = source[:, None, :, None].expand(-1, cache.shape[1], -1, cache.shape[-1])
    return torch.cat([cache[..., :low, :], cache.gather(2, index)], dim=2)
