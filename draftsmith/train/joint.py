"""Medusa-2: heads trained jointly with the target through LoRA (peft).

The target's own behaviour is kept by self-distillation: KL from the frozen target (adapters
disabled) to the adapted one on trained positions, plus the heads' loss on the adapted hidden
states, weighted by `heads_weight_joint`.
"""

from __future__ import annotations

import torch

from draftsmith.models.features import DOCUMENTS_KEY, POSITIONS_KEY
from draftsmith.models.layers import dense_target_logits
from draftsmith.models.losses import wide
from draftsmith.models.medusa import MedusaConfig, medusa_loss
from draftsmith.models.target_states import decoder_mask

LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def wrap_with_lora(target: torch.nn.Module, config: MedusaConfig):
    """The target with LoRA adapters on attention and MLP projections (only they train)."""
    from peft import LoraConfig, get_peft_model

    target.requires_grad_(False)
    present = {name.rsplit(".", 1)[-1] for name, _ in target.named_modules()}
    modules = [m for m in LORA_MODULES if m in present]
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules=modules, bias="none")
    return get_peft_model(target, lora)


def medusa2_loss(heads, peft_target, batch: dict) -> tuple[torch.Tensor, dict]:
    """Self-distillation KL of the adapted target plus the heads' loss on its hidden states."""
    ids, attention, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    documents, positions = batch.get(DOCUMENTS_KEY), batch.get(POSITIONS_KEY)
    if documents is not None:  # packed rows: each document attends to itself, at its positions
        attention = decoder_mask(peft_target, attention, documents)
    with torch.no_grad(), peft_target.disable_adapter():
        reference = wide(peft_target(input_ids=ids, attention_mask=attention,
                                     position_ids=positions).logits)
    out = peft_target(input_ids=ids, attention_mask=attention, position_ids=positions,
                      output_hidden_states=True)
    # logits at t predict token t+1: train where that token is in the loss mask
    valid = torch.cat([loss_mask[:, 1:], loss_mask.new_zeros(loss_mask.shape[0], 1)], 1) > 0
    ref_logp = torch.log_softmax(reference, -1)
    logp = torch.log_softmax(wide(out.logits), -1)
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
    kl = (kl * valid).sum() / valid.sum().clamp_min(1)
    heads_loss, metrics = medusa_loss(heads, ids, loss_mask, out.hidden_states[-1],
                                      dense_target_logits(reference), positions)
    total = kl + heads.config.heads_weight_joint * heads_loss
    return total, {**metrics, "distill_kl": kl.detach()}
