"""DFlash's training objective (and the anchors and labels DSpark shares): anchors drawn per
sequence, each proposal's label position, position weights (decay or D-PACE), and the loss against
the target's distribution (restricted to a draft vocabulary where the drafter has one). See
../shared/REFERENCE.md section 7.1.3."""

from __future__ import annotations

import torch

from draftsmith.models.dflash import DFlashDrafter, default_gamma
from draftsmith.models.layers import batch_generator
from draftsmith.models.losses import row_argmax
from draftsmith.models.masks import document_positions


def draw_anchors(loss_mask: torch.Tensor, attention_mask: torch.Tensor, count: int,
                 generator: torch.Generator | None = None, documents: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `count` anchors per sequence, uniformly without replacement among positions i whose
    token and next token are both trained (`loss_mask[i] & loss_mask[i+1]`, as SpecForge and
    DeepSpec), sorted. `documents`: packed rows' (`train/packing.py`), each document a sequence
    of its own (up to `count` each, its next token in the same document; a document's first
    token, whose loss weight the packed collate sets to 0, is never one: chat data trains none).

    Returns:
        (anchors (Bt, n) long, valid (Bt, n) bool) with n = min(count, most valid in a row)
        (packed: the most any row keeps); a row with fewer repeats its last anchor, marked
        invalid.
    """
    trained = (loss_mask > 0) & (attention_mask > 0)
    valid = trained.clone()
    valid[:, :-1] &= trained[:, 1:]
    valid[:, -1] = False
    noise = torch.rand(valid.shape, device=valid.device, generator=generator)
    noise = noise.masked_fill(~valid, 2.0)  # invalid positions sort last
    if documents is None:
        n = max(1, min(count, int(valid.sum(1).max())))
        picked = noise.topk(n, dim=1, largest=False).indices
    else:
        valid[:, :-1] &= documents[:, 1:] == documents[:, :-1]
        valid = _draw_per_document(valid, noise.masked_fill(~valid, 2.0), count, documents)
        n = max(1, int(valid.sum(1).max()))
        picked = noise.masked_fill(~valid, 3.0).topk(n, dim=1, largest=False).indices
    ok = valid.gather(1, picked)
    position = torch.where(ok, picked, torch.full_like(picked, -1))
    order = torch.sort(torch.where(ok, position, position.new_full((), 1 << 40)), dim=1)
    anchors, ok = order.values, ok.gather(1, order.indices)
    fallback = torch.where(ok, anchors, anchors.new_zeros(())).amax(1, keepdim=True)
    return torch.where(ok, anchors, fallback), ok


def _draw_per_document(valid: torch.Tensor, noise: torch.Tensor, count: int,
                       documents: torch.Tensor) -> torch.Tensor:
    """(Bt, S) bool: the valid positions whose noise ranks below `count` in their document."""
    b, t = documents.shape
    group = (torch.arange(b, device=documents.device)[:, None] * (t + 1) + documents).flatten()
    sizes = torch.bincount(group, minlength=b * (t + 1))
    starts = sizes.cumsum(0) - sizes
    rank = (group.double() * 4 + noise.flatten().double()).argsort().argsort() - starts[group]
    return valid & (rank < count).view(b, t)


def block_trained(loss_mask: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
                  proposals: int) -> torch.Tensor:
    """Which proposals are trained, (Bt, N, P) bool: proposal k (0-based) of a block at anchor a
    predicts the token at a + 1 + k; it is trained when the anchor is valid, that position is
    inside the sequence and every label position of the block up to it is in the loss mask (a
    contiguous prefix, as acceptance is)."""
    s = loss_mask.shape[1]
    positions = anchors[..., None] + torch.arange(1, proposals + 1, device=anchors.device)
    inside = positions < s
    masked = loss_mask.gather(1, positions.clamp(max=s - 1).flatten(1)).view(
        positions.shape) > 0
    return (inside & masked).long().cumprod(-1).bool() & valid[..., None]


def block_plan(loss_mask: torch.Tensor, attention_mask: torch.Tensor, count: int,
               proposals: int, generator: torch.Generator | None = None,
               documents: torch.Tensor | None = None) -> dict:
    """The blocks a batch trains and their rows, counted where the masks live (the collate runs
    this on the host, so the step reads none from the device): `anchors` (Bt, N) and `trained`
    (Bt, N, P) as `draw_anchors` and `block_trained` make them, `selected` (m,) the flat
    (Bt * N * P) index of the trained proposals, and `reach`, per block column the furthest
    anchor of any row as a tuple of ints (rows are sorted, so a chunk of columns reads the
    context up to its last column's: no device read to cut it). Packed rows (`documents`) also
    get `starts` (Bt, N), where each anchor's document starts: its block sees context from
    there."""
    anchors, valid = draw_anchors(loss_mask, attention_mask, count, generator, documents)
    return plan_blocks(loss_mask, anchors, valid, proposals, documents)


def plan_blocks(loss_mask: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
                proposals: int, documents: torch.Tensor | None = None) -> dict:
    """`block_plan` for given anchors (Bt, N) sorted and their validity (Bt, N)."""
    trained = block_trained(loss_mask, anchors, valid, proposals)
    plan = {"anchors": anchors, "trained": trained,
            "selected": trained.flatten().nonzero().squeeze(1),
            "reach": tuple(int(a) for a in anchors.amax(0))}
    if documents is not None:
        plan["starts"] = anchors - document_positions(documents).gather(1, anchors)
    return plan


def collate_block_rows(config, seed: int, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       loss_mask: torch.Tensor, label_shift: int = 0,
                       documents: torch.Tensor | None = None) -> dict:
    """A batch's `block_plan`, made by the training collate on the host (registry
    `collate_rows`): the anchors drawn with a generator seeded by the batch's tokens and `seed`,
    so a resumed run draws what the first did. `label_shift`: 0 for DFlash (B-1 proposals a
    block), 1 for DSpark (B); `documents`: a packed batch's (`train/packing.py`)."""
    return block_plan(loss_mask, attention_mask, config.anchors_per_sequence,
                      config.block_size - 1 + label_shift,
                      batch_generator(seed, input_ids, attention_mask, loss_mask), documents)


def training_blocks(drafter: DFlashDrafter, features) -> dict:
    """The collate's `block_plan` (`features.kind_rows`), or one drawn here (host reads on a
    GPU: evaluation outside training and tests), evaluation drawing the same blocks every time."""
    if features.kind_rows:
        return features.kind_rows
    generator = None if drafter.training else torch.Generator(
        features.input_ids.device).manual_seed(0)
    return block_plan(features.loss_mask, features.attention_mask,
                      drafter.config.anchors_per_sequence, drafter.proposals, generator,
                      features.document_ids)


def scatter_trained(values: torch.Tensor, plan: dict) -> torch.Tensor:
    """(m,) values of the trained proposals -> (Bt, N, P), zero elsewhere (by index)."""
    trained = plan["trained"]
    return values.new_zeros(trained.numel()).index_copy(0, plan["selected"], values).view(
        trained.shape)


def position_weights(config, kinds: str, trained: torch.Tensor, label_prob: torch.Tensor
                     ) -> torch.Tensor:
    """Per-proposal loss weights (Bt, N, P), zero where untrained.

    `decay`: exp(-k/gamma) for proposal k (0-based): exp(-(r-1)/gamma) over DFlash's block rows
    r = 1..B-1 and exp(-r/gamma) over DSpark's r = 0..B-1, as their references weigh them. `dpace`: D-PACE with alpha 0.5:
    q~_k = 0.5 * q_k + 0.5 with q_k the draft's probability of the label, C_j = prod_{k<=j} q~_k,
    w_j = sum_{m>=j} C_m (detached). `uniform`: 1.
    """
    p = trained.shape[-1]
    if kinds == "uniform":
        weights = torch.ones_like(label_prob)
    elif kinds == "decay":
        gamma = config.decay_gamma or default_gamma(config.block_size)
        k = torch.arange(p, device=trained.device, dtype=torch.float32)
        weights = torch.exp(-k / gamma).expand(trained.shape)
    else:
        smoothed = torch.where(trained, 0.5 * label_prob.detach() + 0.5,
                               torch.ones_like(label_prob))
        continuation = torch.cumprod(smoothed, dim=-1) * trained
        weights = continuation.flip(-1).cumsum(-1).flip(-1)
    return weights * trained


def dflash_loss(drafter: DFlashDrafter, features) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Block-drafting loss: every trained proposal of every drawn block against the target.

    Proposal k of the block at anchor a is scored against the target's distribution for the
    token at a + 1 + k (`kl`: soft cross-entropy, which differs from KL(p || q) by the target's
    entropy; `ce`: the target's argmax), weighted by `position_weights`, the sum normalised by the
    sum of weights (Model Optimizer's reduction). With a draft vocabulary the target's distribution
    is restricted to it (renormalised), as EAGLE-3's; a proposal whose target choice lies outside
    it is left out of the loss and counts as a miss.

    Returns:
        (loss, metrics) with `acc_{k}`: top-1 agreement with the target's choice at proposal k
        over the blocks where k is trained.
    """
    cfg = drafter.config
    plan = training_blocks(drafter, features)
    anchors, trained, selected = plan["anchors"], plan["trained"], plan["selected"]
    hidden = drafter.train_hidden(features, anchors, plan["reach"], plan.get("starts"))[:, :, 1 - drafter.label_shift:]
    rows = hidden.flatten(0, 2)[selected]  # (m, H)
    batch_index = torch.arange(anchors.shape[0], device=anchors.device)[:, None, None].expand(
        trained.shape).flatten()[selected]
    labels = (anchors[..., None] + torch.arange(1, trained.shape[-1] + 1,
                                                device=anchors.device)).flatten()[selected]
    draft_ids = drafter.draft_ids()
    with torch.no_grad():
        if draft_ids is None:
            teacher = features.logits_at(batch_index, labels - 1).float()
            choice = row_argmax(teacher)  # the target's choice
            in_vocab = torch.ones_like(choice, dtype=torch.bool)
        else:  # restricted to the draft vocabulary (Vd head rows), choices as draft ids
            teacher, choice = features.restricted_at(draft_ids, batch_index, labels - 1)
            teacher = teacher.float()
            in_vocab = drafter.t2d[choice]
            to_draft = torch.zeros_like(drafter.t2d, dtype=torch.long)
            to_draft[draft_ids] = torch.arange(draft_ids.shape[0], device=draft_ids.device)
            choice = torch.where(in_vocab, to_draft[choice], 0)
    logp = torch.log_softmax(drafter.draft_logits(rows), dim=-1)
    if cfg.loss == "kl":
        per_row = -(torch.softmax(teacher, -1) * logp).sum(-1)
    else:
        per_row = -logp.gather(1, choice[:, None])[:, 0]
    label_prob = scatter_trained(logp.detach().gather(1, choice[:, None])[:, 0].exp() * in_vocab,
                                 plan)
    weights = position_weights(cfg, cfg.position_weights, trained, label_prob)
    row_weights = weights.flatten()[selected] * in_vocab
    loss = (per_row * row_weights).sum() / row_weights.sum().clamp_min(1e-9)
    hits = scatter_trained(((row_argmax(logp) == choice) & in_vocab).float(), plan)
    counts = trained.sum((0, 1)).clamp_min(1)
    metrics = {f"acc_{k}": hits[..., k].sum() / counts[k] for k in range(trained.shape[-1])}
    return loss, metrics
