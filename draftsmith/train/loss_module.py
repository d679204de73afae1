"""The module training runs under DDP/FSDP (`LossModule`: target features, then the drafter's
loss) and the features of one batch, offline or online (`batch_features`), which a drafter that
starts from data statistics also measures before training (`init_from_first_batch`)."""

from __future__ import annotations

import torch

from draftsmith.models.features import (
    DOCUMENTS_KEY,
    NEXT_TRAINED_KEY,
    POSITIONS_KEY,
    cached_features,
    kind_rows_of,
    target_features,
)
from draftsmith.train.joint import medusa2_loss
from draftsmith.train.loader import to_device
from draftsmith.train.target_ahead import AHEAD_KEY


class LossModule(torch.nn.Module):
    """Runs target features and the drafter's loss in `forward`, as DDP and FSDP require.

    A frozen target is kept out of the module tree (not wrapped, not checkpointed); a target
    trained jointly through LoRA (Medusa-2) is a submodule so its adapters train and are saved.
    """

    def __init__(self, drafter, spec, target, aux_layers: list[int], joint: bool):
        super().__init__()
        self.drafter = drafter
        self.spec = spec
        self.aux_layers = aux_layers
        self.joint = joint
        if joint:
            self.target = target
        else:
            self._frozen_target = [target]

    def forward(self, batch: dict):
        if self.joint:
            return medusa2_loss(self.drafter, self.target, batch)
        ahead = batch.get(AHEAD_KEY)  # computed on the target's thread (`train/target_ahead.py`)
        features = ahead.result() if ahead is not None else \
            batch_features(self._frozen_target[0], batch, self.aux_layers)
        return self.spec.loss(self.drafter, features)


def batch_features(target, batch: dict, aux_layers: list[int]):
    """A batch's `Features`: read from the offline cache's tensors, or the frozen target run."""
    num_layers = target.config.num_hidden_layers
    if f"hidden_states.{num_layers}" in batch:  # offline: read from the feature cache
        return cached_features(batch, target.get_output_embeddings(), aux_layers, num_layers)
    return target_features(target, batch["input_ids"], batch["attention_mask"],
                           batch["loss_mask"], aux_layers, batch.get(NEXT_TRAINED_KEY),
                           kind_rows_of(batch), batch.get(DOCUMENTS_KEY),
                           batch.get(POSITIONS_KEY))


def init_from_first_batch(drafter, target, data, aux_layers: list[int], accelerator) -> None:
    """A drafter that starts from data statistics (`init_from_data`, e.g. DFlash's `fc`) measures
    them on this rank's first training batch, averaged over the processes."""
    if not hasattr(drafter, "init_from_data"):
        return
    batch = next(iter(data.train_batches(0, 0)), None)
    many = accelerator.num_processes > 1
    if many:  # every rank takes the same branch: a sharded target's forward is a collective too
        have = accelerator.reduce(torch.tensor([int(batch is not None)],
                                               device=accelerator.device), "sum")
        if int(have[0]) < accelerator.num_processes:
            return
    if batch is None:
        return
    with torch.no_grad():
        features = batch_features(target, to_device(batch, accelerator.device),
                                  aux_layers)
        drafter.init_from_data(features, (lambda t: accelerator.reduce(t, "sum")) if many
                               else None)
