"""DeepSeek-V3-style multi-token prediction (MTP) modules trained on a frozen target.

Module k (1-based) at position i reads `enorm(embed(t_{i+k}))` and `hnorm(h^{k-1}_i)` (h^0 is the
target's last hidden state), projects their concatenation with `eh_proj` (embedding first), runs
one decoder block and predicts t_{i+k+1} through `shared_head.norm` and the target's frozen head.
Module weight names follow DeepSeek-V3's MTP layers (`layers.{k}.enorm`, `.hnorm`, `.eh_proj`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from draftsmith.models.layers import (
    KV,
    DraftDecoderLayer,
    Rotary,
    TargetLogits,
    drafter_layer_config,
    offset_in_sequence,
    self_attention_mask,
    sequence_positions,
    shift_left,
)
from draftsmith.models.losses import (
    PositionLosses,
    check_labels,
    check_position_weights,
    decay_weights,
    parse_loss,
    row_argmax,
    wide,
)


@dataclass
class MTPConfig:
    """MTP settings.

    Attributes:
        num_modules: K sequential modules (K draft tokens per step).
        step_weight: beta; module k's loss weight is beta^(k-1), normalised to sum to 1 (FastMTP).
        labels: `target` (default): each module learns the target's distribution of its token
            (soft cross-entropy: acceptance is decided by the target's choice); `data`: the
            data's tokens (hard labels; right when the data is the target's own answers).
        loss: per-module loss against the target (`labels: target`): kl (default), tv, lk, ce
            or a mixture such as {ce: 0.1, tv: 0.9} (see models/losses.py).
        position_weights: `geometric` (step_weight, normalised; default), `decay` (exp(-k /
            decay_gamma)) or `dpace` (D-PACE, per position from the modules' label
            probabilities).
        decay_gamma: gamma of `decay`.
    """

    num_modules: int = 2
    step_weight: float = 0.6
    labels: str = "target"
    loss: str | dict = "kl"
    position_weights: str = "geometric"
    decay_gamma: float = 4.0

    def __post_init__(self):
        check_labels(self.labels, parse_loss(self.loss))
        check_position_weights(self.position_weights, self.decay_gamma)
        if self.num_modules < 1:
            raise ValueError(f"num_modules={self.num_modules} must be >= 1")


class SharedHead(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.norm = LlamaRMSNorm(hidden, eps)


class MTPModule(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = LlamaRMSNorm(hidden, eps)
        self.hnorm = LlamaRMSNorm(hidden, eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.input_layernorm = LlamaRMSNorm(hidden, eps)
        self.block = DraftDecoderLayer(config, hidden)
        self.shared_head = SharedHead(hidden, eps)

    def forward(self, embeds, hidden, cos, sin, mask, past=None) -> tuple[torch.Tensor, KV]:
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        return self.block(self.input_layernorm(x), x, cos, sin, mask, past)


class MTPDrafter(nn.Module):
    """K MTP modules sharing the target's frozen embedding and head."""

    kind = "mtp"

    def __init__(self, target_config, config: MTPConfig):
        super().__init__()
        layer_config = drafter_layer_config(target_config)
        hidden, vocab = layer_config.hidden_size, target_config.vocab_size
        self.config = config
        self.embed_tokens = nn.Embedding(vocab, hidden).requires_grad_(False)
        self.layers = nn.ModuleList(MTPModule(layer_config) for _ in range(config.num_modules))
        self.lm_head = nn.Linear(hidden, vocab, bias=False).requires_grad_(False)
        self.rotary = Rotary(layer_config)

    def init_from_target(self, target: nn.Module) -> None:
        self.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight.data)
        self.lm_head.weight.data.copy_(target.get_output_embeddings().weight.data)

    def module_hidden(self, k: int, tokens, hidden, position_ids, mask, past=None):
        """Module k (0-based here): tokens (B, T) = t_{i+k+1}, hidden (B, T, H) = h^k ->
        (h^{k+1}, new (keys, values))."""
        hidden = hidden.to(self.layers[k].eh_proj.weight.dtype)
        embeds = self.embed_tokens(tokens).to(hidden.dtype)
        cos, sin = self.rotary(hidden, position_ids)
        return self.layers[k](embeds, hidden, cos, sin, mask, past)

    def module_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Module k's next-token logits from its output hidden states. (..., V)"""
        return self.lm_head(self.layers[k].shared_head.norm(hidden))

    def module_step(self, k: int, tokens, hidden, position_ids, mask, past=None):
        """`module_hidden` then `module_logits`: (h^{k+1}, logits (B, T, V), new (keys, values))."""
        out, kv = self.module_hidden(k, tokens, hidden, position_ids, mask, past)
        return out, self.module_logits(k, out), kv


def mtp_loss(drafter: MTPDrafter, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             loss_mask: torch.Tensor, features: torch.Tensor, target_logits_after: TargetLogits,
             documents: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted cross-entropy of every module on the tokens it predicts (k+1 ahead), on trained
    positions only, against the target's distribution (`labels: target`) or the data's tokens
    (`labels: data`). Module k's rows are i = p - 1 - k for the trained positions p the collate
    counted on the host (`trained_positions`), gathered (no host count); the target's logits
    after p serve every module. Accuracy of module k is agreement with the target's own greedy
    choice. Packed rows (`documents`, `position_ids`: `train/packing.py`) attend within each
    document, at its own positions."""
    cfg = drafter.config
    b, t = input_ids.shape
    positions = sequence_positions(input_ids, position_ids)
    mask = self_attention_mask(attention_mask, documents)
    weights = [cfg.step_weight ** k for k in range(cfg.num_modules)]
    norm = sum(weights)
    weights = [w / norm for w in weights] if cfg.position_weights == "geometric" else \
        decay_weights(cfg.num_modules, cfg.decay_gamma)
    losses = PositionLosses(parse_loss(cfg.loss), cfg.position_weights, weights, b * t,
                            features.device)
    hidden = features
    metrics = {}
    trained = target_logits_after.trained_positions(loss_mask)  # (m,) flat p: token p + 1
    teacher = target_logits_after.every_at(trained)  # (m, V)
    tokens = input_ids.flatten()[trained + 1] if cfg.labels == "data" else None
    offsets = offset_in_sequence(trained, t, position_ids)
    for k in range(cfg.num_modules):
        hidden, _ = drafter.module_hidden(k, shift_left(input_ids, k + 1), hidden, positions, mask)
        valid = offsets > k  # the row p - 1 - k lies in p's sequence
        rows = (trained - 1 - k).clamp_min(0)
        logits = wide(drafter.module_logits(k, hidden.flatten(0, 1)[rows]))
        step_loss = losses.add_rows(k, torch.log_softmax(logits, dim=-1), teacher, valid, rows,
                                    tokens=tokens)
        hits = valid & (row_argmax(logits) == row_argmax(teacher))
        metrics[f"loss_{k}"] = step_loss
        metrics[f"acc_{k}"] = hits.sum().float() / valid.sum().clamp_min(1)
    return losses.total(), metrics
