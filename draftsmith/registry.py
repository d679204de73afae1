"""The one place that names every drafter kind: how to build and train it, which target hidden
states it reads, how it decodes, which of its tensors are frozen copies of the target's, and its
display name. Data, training, evaluation, export and the benchmark ask this table; none of them
keeps a kind table or branches on a kind name, so a new kind is one model module, one entry here
and its export format. The registry imports only `models/`.

EAGLE-2 is not a kind: it is an EAGLE-1 drafter decoded with a dynamic tree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.config_values import build_dataclass
from draftsmith.errors import DraftsmithError
from draftsmith.models.eagle1 import Eagle1Config, Eagle1Drafter, eagle1_loss
from draftsmith.models.eagle3 import Eagle3Config, Eagle3Drafter, eagle3_layer_ids, eagle3_loss
from draftsmith.models.layers import shift_left
from draftsmith.models.medusa import MedusaConfig, MedusaHeads, medusa_loss
from draftsmith.models.mtp import MTPConfig, MTPDrafter, mtp_loss


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
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    last_hidden: torch.Tensor
    aux_hidden: list[torch.Tensor]
    head: nn.Module
    target_argmax: torch.Tensor | None = None

    @functools.cached_property
    def target_logits(self) -> torch.Tensor:
        """(B, T, V) = head(last_hidden), computed once."""
        with torch.no_grad():
            return self.head(self.last_hidden.to(self.head.weight.dtype))

    @functools.cached_property
    def _needed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Trained positions (every position whose next token is in the loss mask) and the row
        index of each position among them (-1 where untrained)."""
        needed = shift_left(self.loss_mask, 1) > 0
        row_of = torch.full(needed.shape, -1, dtype=torch.long, device=needed.device)
        row_of[needed] = torch.arange(int(needed.sum()), device=needed.device)
        return needed, row_of

    @functools.cached_property
    def _trained_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Row index per position (-1 where untrained) and the head's logits on trained rows,
        computed once per batch."""
        needed, row_of = self._needed
        with torch.no_grad():
            rows = self.head(self.last_hidden[needed].to(self.head.weight.dtype))
        return row_of, rows

    def _rows_after(self, valid: torch.Tensor, shift: int) -> torch.Tensor:
        _, row_of = self._needed
        index = shift_left(row_of, shift, -1)[valid]
        if bool((index < 0).any()):
            raise ValueError("target logits requested at a position whose next token is not "
                             "trained")
        return index

    def logits_after(self, valid: torch.Tensor, shift: int) -> torch.Tensor:
        """Target logits (m, V) at i + shift for each position i set in `valid` (a TargetLogits).

        Raises:
            ValueError: a requested position is not a trained one (a loss asked for the wrong row).
        """
        return self._trained_rows[1][self._rows_after(valid, shift)]

    __call__ = logits_after  # the features are themselves a TargetLogits (with `.restricted`)

    def restricted(self, columns: torch.Tensor):
        """A RestrictedTargetLogits (models/layers.py): the trained rows' logits over `columns`
        and their full-vocabulary argmax, sliced and reduced once for the whole batch (EAGLE-3's
        draft vocabulary: a (m, Vd) gather instead of an (m, V) one per training-time-test step).
        With the cache's `target_argmax` and a plain linear head, only the `columns` rows of the
        head are applied: an (m, Vd) product instead of (m, V), the same logits up to float
        rounding, and the argmax the target made on its unrounded hidden state."""
        head = self.head
        plain = isinstance(head, nn.Linear) and head.bias is None
        with torch.no_grad():
            if self.target_argmax is not None and plain:
                needed, _ = self._needed
                hidden = self.last_hidden[needed].to(head.weight.dtype)
                sliced = nn.functional.linear(hidden, head.weight[columns])
                choice = self.target_argmax[needed].long()
            else:
                _, rows = self._trained_rows
                sliced, choice = rows[:, columns], rows.argmax(-1)

        def after(valid: torch.Tensor, shift: int) -> tuple[torch.Tensor, torch.Tensor]:
            index = self._rows_after(valid, shift)
            return sliced[index], choice[index]

        return after


@dataclass(frozen=True)
class DrafterSpec:
    """How one drafter kind is built and trained.

    Attributes:
        kind: registry name.
        title: display name (model cards, reports): "EAGLE-3".
        description: one line for `--help` and errors.
        config_cls: its config dataclass (built from the recipe's `drafter:` section).
        build: (target config, config) -> module.
        aux_layers: (num target layers, config) -> 0-based layer outputs it needs besides the
            last hidden state.
        loss: (module, Features) -> (loss, metrics with `acc_{k}` per draft position).
        proposer: the decoding family eval builds its proposer from: `feature` (autoregressive
            on features: EAGLE), `heads` (parallel heads: Medusa) or `modules` (chained MTP).
        tree_shapes: the tree shapes it decodes with (`chain`, `static`, `dynamic`), default first.
        frozen_prefixes: parameter-name prefixes that are frozen copies of the target's tensors
            (not trained, may be left out of a saved drafter and taken from the target).
        uses_draft_vocab: its head covers a reduced draft vocabulary (EAGLE-3's d2t / t2d).
        trains_target: (config) -> whether the target trains with it through LoRA (Medusa-2).
        custom_aux_layers: (config) -> the layer outputs its recipe chose instead of the default
            (EAGLE-3 `layer_ids`), or None; the hidden-state cache stores them too.
    """

    kind: str
    title: str
    description: str
    config_cls: type
    build: Callable[[object, object], nn.Module]
    aux_layers: Callable[[int, object], list[int]]
    loss: Callable[[nn.Module, Features], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    proposer: str
    tree_shapes: tuple[str, ...]
    frozen_prefixes: tuple[str, ...] = ()
    uses_draft_vocab: bool = False
    trains_target: Callable[[object], bool] = lambda config: False
    custom_aux_layers: Callable[[object], list[int] | None] = lambda config: None

    @property
    def default_tree(self) -> str:
        return self.tree_shapes[0]

    def hidden_indices(self, num_layers: int, config=None) -> tuple[int, ...]:
        """`hidden_states` indices it reads (see data/features.py), the last hidden state last.

        Args:
            num_layers: the target's decoder layer count N.
            config: its config (custom `layer_ids`); None = the kind's defaults.
        """
        config = config if config is not None else self.make_config()
        return (*sorted({i + 1 for i in self.aux_layers(num_layers, config)} - {num_layers}),
                num_layers)

    def make_config(self, values: dict | None = None):
        """Build the config dataclass from a dict; unknown keys are an error listing valid ones."""
        try:
            return build_dataclass(self.config_cls, dict(values or {}), "drafter")
        except ValueError as err:
            raise DraftsmithError(f"drafter settings for {self.kind!r}: {err}") from err


DRAFTERS: dict[str, DrafterSpec] = {
    spec.kind: spec
    for spec in (
        DrafterSpec(
            kind="medusa",
            title="Medusa",
            description="Medusa heads on the last hidden state (Medusa-1; lora: true = Medusa-2)",
            config_cls=MedusaConfig,
            build=MedusaHeads,
            aux_layers=lambda n, cfg: [],
            loss=lambda m, f: medusa_loss(m, f.input_ids, f.loss_mask, f.last_hidden,
                                          f.logits_after),
            proposer="heads",
            tree_shapes=("static", "chain"),
            frozen_prefixes=("lm_head.",),  # shared_head: the target's output layer
            trains_target=lambda cfg: bool(cfg.lora),
        ),
        DrafterSpec(
            kind="eagle1",
            title="EAGLE-1/2",
            description="EAGLE-1 feature drafter (decode with a dynamic tree for EAGLE-2)",
            config_cls=Eagle1Config,
            build=Eagle1Drafter,
            aux_layers=lambda n, cfg: [],
            loss=lambda m, f: eagle1_loss(m, f.input_ids, f.attention_mask, f.loss_mask,
                                          f.last_hidden, f.logits_after),
            proposer="feature",
            tree_shapes=("static", "chain", "dynamic"),
            frozen_prefixes=("embed_tokens.", "lm_head."),
        ),
        DrafterSpec(
            kind="eagle3",
            title="EAGLE-3",
            description="EAGLE-3: fused low/mid/high features, training-time test, draft vocab",
            config_cls=Eagle3Config,
            build=Eagle3Drafter,
            aux_layers=lambda n, cfg: cfg.layer_ids or eagle3_layer_ids(n),
            loss=lambda m, f: eagle3_loss(m, f.input_ids, f.attention_mask, f.loss_mask,
                                          f.aux_hidden, f),
            proposer="feature",
            tree_shapes=("dynamic", "chain", "static"),
            frozen_prefixes=("embed_tokens.",),
            uses_draft_vocab=True,
            custom_aux_layers=lambda cfg: list(cfg.layer_ids) if cfg.layer_ids else None,
        ),
        DrafterSpec(
            kind="mtp",
            title="MTP",
            description="DeepSeek-V3-style multi-token prediction modules (chain drafts)",
            config_cls=MTPConfig,
            build=MTPDrafter,
            aux_layers=lambda n, cfg: [],
            loss=lambda m, f: mtp_loss(m, f.input_ids, f.attention_mask, f.loss_mask,
                                       f.last_hidden, f.logits_after),
            proposer="modules",
            tree_shapes=("chain",),
            frozen_prefixes=("embed_tokens.", "lm_head."),
        ),
    )
}


def get_spec(kind: str) -> DrafterSpec:
    """Raises DraftsmithError for an unknown kind, listing the registered ones."""
    if kind not in DRAFTERS:
        raise DraftsmithError(f"unknown drafter kind {kind!r}; choose one of: {', '.join(DRAFTERS)}")
    return DRAFTERS[kind]


@torch.no_grad()
def cached_features(batch: dict, head: nn.Module, aux_layers: list[int], num_layers: int
                    ) -> Features:
    """Features from a batch of cached hidden states (offline mode); the target logits are
    recomputed with the frozen head. Keys are `hidden_states.{i}` as written by draftsmith.data;
    they are cast to the head's dtype (a bf16 cache feeds a float32 run as float32)."""
    dtype = next(head.parameters()).dtype
    last = batch[f"hidden_states.{num_layers}"].to(dtype)
    return Features(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        loss_mask=batch["loss_mask"],
        last_hidden=last,
        aux_hidden=[batch[f"hidden_states.{i + 1}"].to(dtype) for i in aux_layers],
        head=head,
        target_argmax=batch.get("target_argmax"),
    )


@torch.no_grad()
def target_features(target: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    loss_mask: torch.Tensor, aux_layers: list[int]) -> Features:
    """Run the frozen target once and collect what a drafter needs (online mode).

    Uses the data pipeline's `extract_features`, so online training and the offline cache compute
    the same tensors. `aux_layers` are 0-based layer outputs, i.e. `hidden_states[i + 1]`.
    """
    from draftsmith.data.features import extract_features

    num_layers = target.config.num_hidden_layers
    indices = sorted({num_layers, *[i + 1 for i in aux_layers]})
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask,
             **extract_features(target, input_ids, attention_mask, indices)}
    return cached_features(batch, target.get_output_embeddings(), aux_layers, num_layers)
