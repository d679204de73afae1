"""Leaving torch.distributed's process group at the end of a launched command (`accelerate launch
-m draftsmith.train`, `draftsmith data run` under accelerate or torchrun)."""

from __future__ import annotations

import os
import sys


def leave_process_group(finished: bool) -> None:
    """Leave the process group, if this process joined one.

    `finished` (this rank's work is done and written): in a gloo (CPU) group every rank meets at a
    last barrier and the process exits with status 0 at once, without tearing the group down.
    Tearing gloo down, by destroy_process_group or by the interpreter's exit, aborted a rank
    ("terminate called without an active exception") or left a finished 2-process run hanging, now
    and then on a loaded 2-core machine. Otherwise (NCCL, or a failed run on its way out with its
    error): destroy_process_group.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if finished and dist.get_backend() == "gloo":
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()
