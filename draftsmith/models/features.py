"""`Features`, what a drafter's loss reads of the frozen target for one batch: its hidden states
(computed by `target_states.extract_features` online, or read from the offline cache) and the
target's logits, recomputed from the last hidden state with the frozen `lm_head` rather than
stored (a V-sized row per token would dwarf everything else), and the batch keys the collate
sets for it. Hidden-state indices and keys: `models/target_states.py`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import nn

from draftsmith.models.layers import next_trained_rows, shift_left
from draftsmith.models.losses import row_argmax
from draftsmith.models.target_states import extract_features, hidden_indices, hidden_key

HEAD_CHUNK = 1024  # rows per full-vocabulary head product in `Features.restricted_every_at`
NEXT_TRAINED_KEY = "next_trained"  # the batch key of `next_trained_rows`, set by the collate
KIND_ROWS = "kind_rows."  # batch keys of a kind's own rows, drawn by the collate (`collate_rows`)
DOCUMENTS_KEY = "document_ids"  # a packed batch's (B, T) document ids (`train/packing.py`)
POSITIONS_KEY = "position_ids"  # and each token's position in its document


def kind_rows_of(batch: dict) -> dict[str, torch.Tensor]:
    """A kind's own rows that the collate drew on the host (registry `collate_rows`), by name."""
    return {k[len(KIND_ROWS):]: v for k, v in batch.items() if k.startswith(KIND_ROWS)}


@dataclass
class Features:
    """What a drafter's loss reads from the frozen target for one batch.

    Attributes:
        input_ids, attention_mask, loss_mask: (B, T).
        last_hidden: (B, T, H) the target's last hidden state (after the final norm).
        aux_hidden: (B, T, H) target layer outputs a drafter asked for (EAGLE-3: low, mid, high).
        head: the target's frozen output head; logits are computed from `last_hidden` on demand.
        target_argmax: (B, T) the target's greedy choice after each position, when the offline
            cache stored it (`data/cache.py`); lets `restricted` skip the full-vocabulary head.
        next_trained: (m,) `next_trained_rows(loss_mask)` as the collate computed it on the host;
            None = counted here when a loss first asks (a host read on a GPU).
        kind_rows: the rows a kind's collate drew on the host (registry `collate_rows`; P-EAGLE's
            COD draw), by name; empty = the loss draws them itself.
        document_ids, position_ids: (B, T) of a packed batch (`train/packing.py`), else None.
        teacher_ahead: what a kind's loss reads of the target's head, computed on the target's
            thread (`train.overlap_target`, a drafter's `warm_teacher`), else None.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    last_hidden: torch.Tensor
    aux_hidden: list[torch.Tensor]
    head: nn.Module
    target_argmax: torch.Tensor | None = None
    next_trained: torch.Tensor | None = None
    kind_rows: dict[str, torch.Tensor] = field(default_factory=dict)
    document_ids: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    teacher_ahead: object | None = None

    @functools.cached_property
    def target_logits(self) -> torch.Tensor:
        """(B, T, V) = head(last_hidden), computed once."""
        with torch.no_grad():
            return self.head(self.last_hidden.to(self.head.weight.dtype))

    @functools.cached_property
    def _needed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Trained positions (every position whose next token is in the loss mask) and the row
        index of each position among them (-1 where untrained), counted on the device."""
        needed = shift_left(self.loss_mask, 1) > 0
        row_of = torch.where(needed, needed.long().flatten().cumsum(0).view_as(needed) - 1, -1)
        return needed, row_of

    @functools.cached_property
    def _trained_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Row index per position (-1 where untrained) and the head's logits on trained rows,
        computed once per batch."""
        _, row_of = self._needed
        with torch.no_grad():
            rows = self.every_at(self.trained_positions(self.loss_mask))
        return row_of, rows

    def _rows_after(self, valid: torch.Tensor, shift: int) -> torch.Tensor:
        _, row_of = self._needed
        index = shift_left(row_of, shift, -1)[valid]
        _check_trained(index)
        return index

    def __call__(self, valid: torch.Tensor, shift: int) -> torch.Tensor:
        """Target logits (m, V) at i + shift for each position i set in `valid` (a TargetLogits).

        Raises:
            RuntimeError: a requested position is not a trained one (a loss asked for the wrong
                row; raised where the device reports it).
        """
        return self._trained_rows[1][self._rows_after(valid, shift)]

    @property
    def logits_after(self) -> Features:
        """The features as a TargetLogits (models/layers.py): what the per-position losses take."""
        return self

    def trained_positions(self, loss_mask: torch.Tensor) -> torch.Tensor:
        """`next_trained`: (m,) flat positions whose next token is trained (`loss_mask` is this
        batch's, used only when the collate did not count them)."""
        if self.next_trained is None:
            self.next_trained = next_trained_rows(loss_mask)
        return self.next_trained

    def every_at(self, rows: torch.Tensor) -> torch.Tensor:
        """(m, V) target logits after flat positions `rows`."""
        with torch.no_grad():
            if "target_logits" in self.__dict__:
                return self.target_logits.flatten(0, 1)[rows]
            return self.head(self.last_hidden.flatten(0, 1)[rows].to(self.head.weight.dtype))

    def restricted_every_at(self, columns: torch.Tensor, rows: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's logits after flat positions `rows` over `columns` (m, C) and its
        full-vocabulary argmax (m,). With the cache's `target_argmax` and a plain linear head,
        only the `columns` rows of the head are applied: an (m, C) product instead of (m, V),
        the same logits up to float rounding. Otherwise the full product runs in row chunks of
        `HEAD_CHUNK` (its argmax needs every column), each sliced at once, so no (m, V) block
        is held."""
        head = self.head
        with torch.no_grad():
            if self.target_argmax is not None and isinstance(head, nn.Linear) \
                    and head.bias is None:
                hidden = self.last_hidden.flatten(0, 1)[rows].to(head.weight.dtype)
                return nn.functional.linear(hidden, head.weight[columns]), \
                    self.target_argmax.flatten()[rows].long()
            if "target_logits" in self.__dict__:
                logits = self.target_logits.flatten(0, 1)[rows]
                return logits[:, columns], row_argmax(logits)
            hidden = self.last_hidden.flatten(0, 1)[rows].to(head.weight.dtype)
            sliced, choice = [], []
            for chunk in hidden.split(HEAD_CHUNK):
                logits = head(chunk)
                sliced.append(logits[:, columns])
                choice.append(row_argmax(logits))
        return torch.cat(sliced), torch.cat(choice)

    def logits_at(self, batch_index: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Target logits (m, V) after positions (batch_index[i], positions[i]) (block drafters'
        labels at arbitrary offsets); each position's next token must be trained.

        Raises:
            RuntimeError: a requested position's next token is not trained (a loss bug).
        """
        return self._trained_rows[1][self._rows_at(batch_index, positions)]

    def _rows_at(self, batch_index: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Trained-row index of each (batch_index[i], positions[i]); RuntimeError if untrained."""
        _, row_of = self._needed
        index = row_of[batch_index, positions]
        _check_trained(index)
        return index

    def restricted_rows(self, columns: torch.Tensor):
        """A RestrictedTargetLogits (models/layers.py): every trained row's logits over `columns`
        and full-vocabulary argmax, sliced and reduced once for the whole batch, gathered after
        given flat positions by index (P-EAGLE's anchors). See `_restricted_rows`.

        Raises:
            RuntimeError: a requested position's next token is not trained (a loss bug; raised
                where the device reports it).
        """
        sliced, choice = self._restricted_rows(columns)
        _, row_of = self._needed

        def after(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            index = row_of.flatten()[rows]
            _check_trained(index)
            return sliced[index], choice[index]

        return after

    def restricted_at(self, columns: torch.Tensor, batch_index: torch.Tensor,
                      positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`logits_at` over `columns` only, with the full-vocabulary argmax: ((m, len(columns)),
        (m,)) (DFlash's draft vocabulary; see `_restricted_rows`).

        Raises:
            RuntimeError: a requested position's next token is not trained (a loss bug).
        """
        index = self._rows_at(batch_index, positions)
        sliced, choice = self._restricted_rows(columns)
        return sliced[index], choice[index]

    def _restricted_rows(self, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every trained row's logits over `columns` and full-vocabulary argmax (callers compute
        it once per batch), as `restricted_every_at` computes them."""
        head = self.head
        plain = isinstance(head, nn.Linear) and head.bias is None
        with torch.no_grad():
            if self.target_argmax is not None and plain:
                trained = self.trained_positions(self.loss_mask)
                hidden = self.last_hidden.flatten(0, 1)[trained].to(head.weight.dtype)
                sliced = nn.functional.linear(hidden, head.weight[columns])
                choice = self.target_argmax.flatten()[trained].long()
            else:
                _, rows = self._trained_rows
                sliced, choice = rows[:, columns], row_argmax(rows)
        return sliced, choice


def _check_trained(index: torch.Tensor) -> None:
    """Raise where a loss asked for an untrained position (index -1), checked on the device
    without waiting for it (RuntimeError once the device reports it)."""
    torch._assert_async((index >= 0).all(), "target logits requested at a position whose next "
                        "token is not trained")


@torch.no_grad()
def cached_features(batch: dict, head: nn.Module, aux_layers: list[int], num_layers: int
                    ) -> Features:
    """Features from a batch of cached hidden states (offline mode); the target logits are
    recomputed with the frozen head. Keys are `hidden_key(i)`, as the cache writes them;
    they are cast to the head's dtype (a bf16 cache feeds a float32 run as float32). The
    collate's `NEXT_TRAINED_KEY`, when the batch has it, becomes `next_trained`, and its kind rows
    (`KIND_ROWS` keys) `kind_rows`."""
    dtype = next(head.parameters()).dtype
    last = batch[hidden_key(num_layers)].to(dtype)
    return Features(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        loss_mask=batch["loss_mask"],
        last_hidden=last,
        aux_hidden=[batch[hidden_key(i + 1)].to(dtype) for i in aux_layers],
        head=head,
        target_argmax=batch.get("target_argmax"),
        next_trained=batch.get(NEXT_TRAINED_KEY),
        kind_rows=kind_rows_of(batch),
        document_ids=batch.get(DOCUMENTS_KEY),
        position_ids=batch.get(POSITIONS_KEY),
    )


@torch.no_grad()
def target_features(target: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    loss_mask: torch.Tensor, aux_layers: list[int],
                    next_trained: torch.Tensor | None = None,
                    kind_rows: dict[str, torch.Tensor] | None = None,
                    documents: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None) -> Features:
    """Run the frozen target once and collect what a drafter needs (online mode).

    Uses `extract_features`, as the data pipeline's cache does, so online training and the offline
    cache compute the same tensors. `aux_layers` are 0-based layer outputs, i.e. `hidden_states[i + 1]`.
    `next_trained`: the collate's `next_trained_rows(loss_mask)`, if it counted them;
    `kind_rows`: the rows a kind's collate drew (`Features.kind_rows`); `documents`,
    `position_ids`: a packed batch's (`train/packing.py`).
    """
    num_layers = target.config.num_hidden_layers
    indices = hidden_indices(num_layers, aux_layers)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
             NEXT_TRAINED_KEY: next_trained,
             **{KIND_ROWS + k: v for k, v in (kind_rows or {}).items()},
             **({} if documents is None else {DOCUMENTS_KEY: documents,
                                              POSITIONS_KEY: position_ids}),
             **extract_features(target, input_ids, attention_mask, indices, documents,
                                position_ids)}
    return cached_features(batch, target.get_output_embeddings(), aux_layers, num_layers)
