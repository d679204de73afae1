"""The training run's optimizer: AdamW (the default), or Muon for the drafter's matrix weights with
AdamW for the rest (speculators' split, REFERENCE.md section 7.6).

Muon takes every trainable drafter parameter that is 2-D with min(shape) > 1 and whose name holds
neither `embed_tokens` nor `lm_head` (`torch.optim.Muon`'s update: momentum 0.95, weight decay 0.1,
five Newton-Schulz steps, `match_rms_adamw` learning-rate scaling, peak rate `train.muon_lr`; the
iteration in bfloat16 only where bf16 runs fast, train/muon.py); AdamW
takes norms, biases, heads, embeddings and a jointly trained target's adapters. Both live in one
`MuonWithAdamW` optimizer whose parameter groups are theirs, so accelerate, the LR schedule (one
factor for every group) and checkpoints (one optimizer state) handle both, stepped together.
"""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.errors import DraftsmithError
from draftsmith.train.muon import Muon, newton_schulz_dtype

OPTIMIZERS = ("adamw", "muon")
ADAMW_BETAS = (0.9, 0.95)
MUON_MOMENTUM = 0.95
MUON_WEIGHT_DECAY = 0.1
MUON_LR_FACTOR = 10.0  # muon_lr = 10 x lr by default; speculators 0.9's default is lr itself


def check_optimizer(name: str) -> None:
    """Raises DraftsmithError for an unknown optimizer, or Muon on a torch without it."""
    if name not in OPTIMIZERS:
        raise DraftsmithError(f"train.optimizer={name!r}: use one of {', '.join(OPTIMIZERS)}")
    if name == "muon" and not hasattr(torch.optim, "Muon"):
        raise DraftsmithError(f"train.optimizer=muon needs torch.optim.Muon (torch >= 2.9); this "
                              f"torch is {torch.__version__}: upgrade torch or set "
                              "train.optimizer=adamw")


def takes_muon(name: str, param: nn.Parameter) -> bool:
    """Whether Muon optimizes this trainable parameter (a real matrix, not an embedding or head)."""
    return (param.requires_grad and param.dim() == 2 and min(param.shape) > 1
            and "embed_tokens" not in name and "lm_head" not in name)


class MuonWithAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` and `torch.optim.AdamW` as one optimizer: `param_groups` are Muon's then
    AdamW's (the same dicts), `state` is shared, `step` steps both."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer):
        self.muon, self.adamw = muon, adamw
        super().__init__([*muon.param_groups, *adamw.param_groups], {})
        self._link()

    def _link(self) -> None:
        count = len(self.muon.param_groups)
        self.muon.param_groups = self.param_groups[:count]
        self.adamw.param_groups = self.param_groups[count:]
        self.muon.state = self.adamw.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """Load (which rebuilds the groups and state) and hand the new ones back to both."""
        super().load_state_dict(state_dict)
        self._link()


def build_optimizer(drafter: nn.Module, cfg, joint_params: list[nn.Parameter] | None = None,
                    sharded: bool = False,
                    device: str | torch.device = "cpu") -> torch.optim.Optimizer:
    """The optimizer of a run.

    Args:
        drafter: the drafter module (its trainable parameters, by name).
        cfg: the recipe's `train` section (`optimizer`, `lr`, `muon_lr`, `weight_decay`).
        joint_params: a jointly trained target's adapters (Medusa-2), at lr / 4 under AdamW.
        sharded: the run shards parameters (FSDP), so no process holds a whole matrix.
        device: where the drafter trains (Muon's iteration dtype: `muon.newton_schulz_dtype`).

    Raises:
        DraftsmithError: Muon on sharded parameters.
    """
    if cfg.optimizer == "muon" and sharded:
        raise DraftsmithError("train.optimizer=muon orthogonalises whole weight matrices, which "
                              "FSDP shards across processes; launch with DDP "
                              "(recipes/accelerate/ddp.yaml: a drafter fits on every device) or "
                              "set train.optimizer=adamw")
    adamw_groups = []
    trained = [(n, p) for n, p in drafter.named_parameters() if p.requires_grad]
    matrices = [p for n, p in trained if takes_muon(n, p)] if cfg.optimizer == "muon" else []
    chosen = {id(p) for p in matrices}
    rest = [p for _, p in trained if id(p) not in chosen]
    if rest:
        adamw_groups.append({"params": rest, "lr": cfg.lr})
    if joint_params:
        adamw_groups.append({"params": joint_params, "lr": cfg.lr / 4})
    adamw = torch.optim.AdamW(adamw_groups, betas=ADAMW_BETAS, weight_decay=cfg.weight_decay) \
        if adamw_groups else None
    if not matrices:
        return adamw
    muon_lr = cfg.muon_lr if cfg.muon_lr is not None else MUON_LR_FACTOR * cfg.lr
    muon = Muon(matrices, ns_dtype=newton_schulz_dtype(device), lr=muon_lr, momentum=MUON_MOMENTUM,
                weight_decay=MUON_WEIGHT_DECAY, adjust_lr_fn="match_rms_adamw")
    if adamw is None:
        return muon
    return MuonWithAdamW(muon, adamw)
