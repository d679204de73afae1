"""Which rows each EAGLE-3 (and P-EAGLE) training-time-test step computes and trains, counted on
the host by the collate (`ttt_row_plan`), and the dense attention masks of those steps
(`ttt_masks`), the reference that `ttt_attention` computes without building.
"""

from __future__ import annotations

import torch

from draftsmith.models.layers import next_trained_rows, shift_left


def ttt_masks(attention_mask: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Attention masks of each TTT step over [block 0, ..., block j] keys.

    Step j (0-based): causal over block 0 (hiding padding), plus only the same position in each
    later block 1..j. Returns bool masks of shape (B, 1, T, (j+1)*T). Training computes this
    pattern without building it (`ttt_attention.ttt_attention`); the masks are the dense
    reference (tests, the speculators-compatible forward).
    """
    b, t = attention_mask.shape
    device = attention_mask.device
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()[None, None]
    block0 = causal & attention_mask[:, None, None, :].bool()
    block0 = block0 | torch.eye(t, dtype=torch.bool, device=device)[None, None]
    diag = torch.eye(t, dtype=torch.bool, device=device)[None, None].expand(b, 1, t, t)
    return [torch.cat([block0] + [diag] * j, dim=-1) for j in range(steps)]


def ttt_rows(attention_mask: torch.Tensor, valid: list[torch.Tensor]) -> list[torch.Tensor]:
    """Positions each TTT step must compute, (B, T) bool each, given where each step is trained.

    Step 0: every real token (its keys are block 0 of every later step). Step j > 0: only the
    positions trained at step j or later, since a later step reads a position's own earlier
    outputs and keys only (the diagonal blocks of `ttt_masks`). Each set holds the next one.
    """
    needed, later = [], torch.zeros_like(valid[0])
    for step_valid in reversed(valid[1:]):
        later = later | step_valid
        needed.append(later)
    return [attention_mask.bool() | valid[0], *reversed(needed)]


def label_valid(loss_mask: torch.Tensor, steps: int, documents: torch.Tensor | None = None
                ) -> list[torch.Tensor]:
    """Where each step's label is trained, (B, T) bool per step: position i at step (or depth) j
    is trained to predict token i + j + 2, which must be in the loss mask and inside the row (and
    in i's document, for packed rows' `documents`)."""
    t = loss_mask.shape[1]
    index = torch.arange(t, device=loss_mask.device)[None]
    valid = [(shift_left(loss_mask, 2 + j) > 0) & (index < t - 2 - j) for j in range(steps)]
    if documents is not None:
        valid = [v & (shift_left(documents, 2 + j) == documents) for j, v in enumerate(valid)]
    return valid


def ttt_row_plan(attention_mask: torch.Tensor, loss_mask: torch.Tensor, steps: int,
                 documents: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The rows each training-time-test step computes and trains, as flat (B * T) positions and
    indices between them (counted where the masks live: the collate runs this on the host, so the
    step reads none from the device).

    Per step j: `rows.{j}`, the positions it computes (`ttt_rows`: every real token at step 0,
    then the positions trained at j or later), ascending; `keep.{j}` (j > 0), where they sit among
    step j-1's rows; `source.{j}`, the positions whose step-j label is trained (position i, label
    token i + j + 2); `head.{j}`, where those sit among `rows.{j}`; `label.{j}`, where their label
    positions i + 1 + j sit among `next_trained_rows(loss_mask)` (the target's trained rows).

    Args:
        attention_mask, loss_mask: (B, T), right-padded.
        steps: TTT steps.
        documents: (B, T) document ids of packed rows (`train/packing.py`), or None.
    """
    valid = label_valid(loss_mask, steps, documents)
    trained = next_trained_rows(loss_mask)
    plan: dict[str, torch.Tensor] = {}
    previous = None
    for j, needed in enumerate(ttt_rows(attention_mask, valid)):
        rows = needed.flatten().nonzero().squeeze(1)
        sources = valid[j].flatten().nonzero().squeeze(1)
        plan[f"rows.{j}"], plan[f"source.{j}"] = rows, sources
        if previous is not None:
            plan[f"keep.{j}"] = torch.searchsorted(previous, rows)
        plan[f"head.{j}"] = torch.searchsorted(rows, sources)
        plan[f"label.{j}"] = torch.searchsorted(trained, sources + 1 + j)
        previous = rows
    return plan
