"""What a drafter module must offer: to training, to a decoding family, to export.

Every drafter kind's module (one per kind in `models/`, built by its `DrafterSpec.build`) is a
`DrafterModule`; the decoding family its spec names (`DrafterSpec.proposer`) asks for one of the
family protocols below; a kind with a reduced draft vocabulary (`DrafterSpec.uses_draft_vocab`)
is also a `DraftVocabModule`. Training calls the spec's `loss(module, Features)`; export reads the
module's `state_dict()` and its `config` dataclass (saved as `drafter_config`).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

KV = tuple[torch.Tensor, torch.Tensor]


class DrafterModule(Protocol):
    """What training and export use of every drafter module (an `nn.Module`).

    Attributes:
        config: the kind's config dataclass it was built from.
    """

    config: object

    def init_from_target(self, target: nn.Module) -> None:
        """Copy what it shares with the frozen target (embeddings, output head) before training or
        after loading a folder that leaves those frozen copies out."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Its tensors under the names the drafter folder and the export formats map."""


class DraftVocabModule(DrafterModule, Protocol):
    """A drafter whose head covers a reduced draft vocabulary (EAGLE-3's d2t / t2d)."""

    def set_draft_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Install the draft vocabulary: d2t (Vd,) offsets to target ids, t2d (V,) bool."""


class FeatureDrafterModule(DrafterModule, Protocol):
    """The `feature` family (EAGLE-1/2, EAGLE-3): autoregressive on the target's features."""

    def target_feature(self, last_hidden: torch.Tensor, hidden_states, index) -> torch.Tensor:
        """Its input features (m, H) at target positions `index`, from a forward's last hidden
        state (n, H) and, when it fuses layers, every layer's hidden states."""

    def draft(self, tokens: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor,
              mask: torch.Tensor, past: KV | None = None, last_only: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, KV]:
        """One decode-time step on one sequence: (m,) tokens and (m, H) features -> (next
        features (m, H), log-probs over the target vocabulary (m, or 1 with `last_only`, V), the
        new keys and values)."""


class HeadsDrafterModule(DrafterModule, Protocol):
    """The `heads` family (Medusa): parallel heads on the last hidden state.

    Attributes:
        heads: one head per draft position."""

    heads: nn.ModuleList

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) last hidden states -> (K, ..., V) logits of draft positions 1..K."""


class ModuleChainDrafterModule(DrafterModule, Protocol):
    """The `modules` family (DeepSeek-V3 MTP): chained modules, one draft each.

    Attributes:
        layers: the modules, in draft order."""

    layers: nn.ModuleList

    def module_step(self, k: int, tokens: torch.Tensor, hidden: torch.Tensor,
                    position_ids: torch.Tensor, mask: torch.Tensor, past: KV | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, KV]:
        """Module k on (1, n) tokens and (1, n, H) inputs -> (outputs (1, n, H), logits (1, n,
        V), new keys and values)."""
