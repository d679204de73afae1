"""EAGLE-3 and DFlash drafters overfit on one token sequence of a real target: the engine gate's
drafters.

SpecForge gates its exports the same way: a drafter that has memorised one answer must see
(nearly) every draft token of it accepted by the engine, or the export loses something the engine
needs (aux layer ids, norms, keys, the draft vocabulary mapping).
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.models.eagle3 import eagle3_loss
from draftsmith.models.features import Features
from draftsmith.models.layers import dense_target_logits
from draftsmith.registry import get_spec
from tests.helpers.export_helpers import write_checkpoint


def overfit_eagle3(target, tokens: list[int], answer_start: int, folder: Path, *,
                   draft_vocab_size: int = 1024, ttt_steps: int = 3, steps: int = 80,
                   lr: float = 3e-3, extra: dict | None = None) -> Path:
    """Train an EAGLE-3 drafter on `tokens` (answer from `answer_start`) and write its checkpoint.

    The draft vocabulary holds every token of the sequence plus the lowest other ids, so the
    export carries a real (non-identity) d2t mapping. `ttt_steps` as deep as the engine drafts
    keeps each step cheap. `extra`: more drafter settings (EAGLE-3.1's fc_norm / norm_output).
    Returns the checkpoint folder.
    """
    settings = {"draft_vocab_size": draft_vocab_size, "ttt_steps": ttt_steps, **(extra or {})}
    spec = get_spec("eagle3")
    torch.manual_seed(0)
    module = spec.build(target.config, spec.make_config(settings))
    vocab = target.config.vocab_size
    used = sorted(set(tokens))
    used += [i for i in range(vocab) if i not in set(used)][:draft_vocab_size - len(used)]
    used = torch.tensor(sorted(used))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    module.set_draft_vocab(used - torch.arange(draft_vocab_size), t2d)
    module.init_from_target(target)
    input_ids = torch.tensor([tokens])
    with torch.no_grad():
        out = target(input_ids, output_hidden_states=True)
    aux = [out.hidden_states[i + 1] for i in module.layer_ids]
    attention = torch.ones_like(input_ids)
    loss_mask = torch.zeros_like(input_ids)
    loss_mask[:, answer_start:] = 1
    teacher = dense_target_logits(out.logits)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))
    for _ in range(steps):
        loss, _ = eagle3_loss(module, input_ids, attention, loss_mask, aux, teacher)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return write_checkpoint(folder, "eagle3", module.eval(), target, settings,
                            training_steps=steps)


def overfit_dflash(target, tokens: list[int], answer_start: int, folder: Path, *,
                   block_size: int = 4, num_layers: int = 2, steps: int = 160,
                   lr: float = 3e-3) -> Path:
    """Train a DFlash drafter on `tokens` (answer from `answer_start`), every block of the answer
    at once, and write its checkpoint. Two draft layers fuse two target layers, so a shifted
    layer id in an export shows.

    SmolLM2's layer outputs carry a few massive dimensions at every position (layer 27: |h| up
    to ~2.5e4 in one dimension against an RMS of ~130), so a random `fc` fuses nearly the same
    vector everywhere (mean pairwise cosine 0.77) and the drafter sits on the unigram plateau
    for a long time. `fc` therefore starts as a per-dimension rescaling of each layer with those
    dimensions dropped, and the layers' output projections at zero (each layer starts as the
    identity); the loss is CE on the target's argmax with uniform weights. Measured: every block
    position agrees with the target after ~150 steps. Returns the checkpoint folder."""
    settings = {"block_size": block_size, "num_layers": num_layers, "anchors_per_sequence": 512,
                "loss": "ce", "position_weights": "uniform"}
    spec = get_spec("dflash")
    torch.manual_seed(0)
    module = spec.build(target.config, spec.make_config(settings))
    module.init_from_target(target)
    input_ids = torch.tensor([tokens])
    with torch.no_grad():
        out = target(input_ids, output_hidden_states=True)
        aux = [out.hidden_states[i + 1] for i in module.target_layer_ids]
        blocks = []
        for hidden in aux:
            rows = hidden[0, 1:]  # the first position's state is special in most targets
            ordinary = rows.abs().amax(0) < 20 * rows.pow(2).mean().sqrt()
            blocks.append(torch.diag(ordinary.float() / (rows.abs().median(0).values + 1e-3)))
        module.fc.weight.copy_(torch.cat(blocks, dim=1) / len(aux))
        for layer in module.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    loss_mask = torch.zeros_like(input_ids)
    loss_mask[:, answer_start:] = 1
    features = Features(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                        loss_mask=loss_mask, last_hidden=out.hidden_states[-1], aux_hidden=aux,
                        head=target.get_output_embeddings())
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))
    module.train()
    for _ in range(steps):
        loss, _ = spec.loss(module, features)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return write_checkpoint(folder, "dflash", module.eval(), target, settings,
                            training_steps=steps)
