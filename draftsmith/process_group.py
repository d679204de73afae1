"""Leaving torch.distributed's process group at the end of a launched command (`accelerate launch
-m draftsmith.train`, `draftsmith data run` under accelerate or torchrun)."""

from __future__ import annotations

import os
import sys


def leave_process_group(finished: bool) -> None:
    """Leave the process group, if this process joined one.

    Tearing a gloo (CPU) group down, by destroy_process_group or by the interpreter's exit, aborted a
    rank ("terminate called without an active exception") or left a finished 2-process run
    hanging, now and then on a loaded 2-core machine. So in a gloo group of several processes:
    `finished` (this rank's work is done and written): every rank meets at a last barrier and the
    process exits with status 0 at once, without teardown; when another rank left with an error
    instead, this one exits with status 1 saying so. A failed run (not `finished`) leaves the group
    as it is, so its error is printed before any teardown. NCCL groups: destroy_process_group.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() != "gloo":
        dist.destroy_process_group()
        return
    if not finished or dist.get_world_size() == 1:
        return
    try:
        dist.barrier()
    except Exception as err:  # a rank that failed closed its connections
        print(f"draftsmith: rank {dist.get_rank()} finished, but another process of the run left "
              f"with an error (its own message says which; here: {type(err).__name__})",
              file=sys.stderr)
        code = 1
    else:
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
