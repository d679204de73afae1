"""Leaving torch.distributed's process group at the end of a launched command (`accelerate launch
-m draftsmith.train`, `draftsmith data run` under accelerate or torchrun)."""

from __future__ import annotations

import os
import sys


def leave_process_group(finished: bool) -> None:
    """Leave the process group, if this process joined one.

    Tearing a gloo (CPU) group down can deadlock or abort a finished run. Seen (py-spy, a 2-process
    training run hung after saving its drafter): freeing the DDP model on return freed its reducer,
    whose gloo group's destructor joins gloo's worker thread while holding the GIL, and that thread
    waits for the GIL to release its last barrier's tensors. destroy_process_group or the
    interpreter's exit aborted a rank instead ("terminate called without an active exception").
    So in a gloo group of several processes, called while the run's models are still referenced:
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
