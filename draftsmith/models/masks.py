"""The attention mask of packed rows (`train/packing.py`), shared by the target's forward and the
drafters' attention."""

from __future__ import annotations

import torch


def document_causal_mask(documents: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool causal mask of packed rows: a query sees the keys of its own document up
    to itself; padding (document 0) sees itself only.

    Args:
        documents: (B, T) document index of each token (1, 2, ... in a row; 0 on padding).
    """
    t = documents.shape[1]
    same = (documents[:, :, None] == documents[:, None, :]) & (documents[:, None, :] > 0)
    causal = torch.ones(t, t, dtype=torch.bool, device=documents.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=documents.device)
    return ((same & causal) | eye)[:, None]


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """(B, T) each token's position in its document of packed rows (0 at each document's first
    token; a row's padding counts on from 0 where it starts), as the collate lays them out."""
    t = documents.shape[1]
    index = torch.arange(t, device=documents.device).expand_as(documents)
    first = torch.ones_like(documents, dtype=torch.bool)
    first[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return index - torch.where(first, index, 0).cummax(1).values
