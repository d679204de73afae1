"""The processes of a data run: one, or several started by `accelerate launch` (or torchrun), which
split the hidden-state extraction between them (`cache.build_feature_cache`: each rank its shards,
rank 0 merges the manifest) while rank 0 alone regenerates and renders.

The process group is torch's own (gloo on CPUs, NCCL on GPUs) with a long timeout: the other
ranks wait at the first barrier while rank 0 regenerates, which can take hours.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from draftsmith.errors import DraftsmithError

WAIT = timedelta(days=2)  # the longest rank 0 may regenerate while the others wait


@dataclass(frozen=True)
class Ranks:
    """This process's place in a data run.

    Attributes:
        rank, world_size: as torch.distributed numbers them (0 and 1 for one process).
        device: where this rank runs the target (`cuda:LOCAL_RANK` on a GPU host, else `cpu`);
            None for one process (the recipe's `target.device` decides).
    """

    rank: int = 0
    world_size: int = 1
    device: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def share(self, value):
        """Rank 0's `value`, on every rank (a barrier too)."""
        if not self.distributed:
            return value
        box = [value if self.is_main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value) -> list:
        """Every rank's `value`, in rank order, on every rank (a barrier too)."""
        if not self.distributed:
            return [value]
        values = [None] * self.world_size
        torch.distributed.all_gather_object(values, value)
        return values

    def raise_if_any(self, error: str | None) -> None:
        """Every rank meets here (a gather); when any rank brings an error, every rank raises:
        its own message, else the first rank's. A rank that raised alone would leave the others
        waiting in their next collective for up to `WAIT`.

        Raises:
            DraftsmithError: some rank's `error`.
        """
        errors = [e for e in self.gather(error) if e]
        if errors:
            raise DraftsmithError(error or f"another process of the run stopped: {errors[0]}")

    def owns(self, shard_index: int) -> bool:
        """Shard `shard_index` is this rank's to write (round robin)."""
        return shard_index % self.world_size == self.rank


ONE_PROCESS = Ranks()


def launched_ranks() -> Ranks:
    """The ranks of this process, joining the process group when launched as several
    (`WORLD_SIZE` > 1 in the environment); one process otherwise.

    Raises:
        DraftsmithError: launched as several without the rendezvous variables.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Ranks()
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise DraftsmithError(f"WORLD_SIZE={world_size} but {', '.join(missing)} not set; start "
                              "several processes with `accelerate launch -m draftsmith data run "
                              "--config RECIPE`")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    dist = torch.distributed
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=WAIT)
    return Ranks(dist.get_rank(), dist.get_world_size(), f"cuda:{local}" if cuda else "cpu")

