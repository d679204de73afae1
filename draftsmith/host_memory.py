"""Keep freed host memory for reuse in a CPU training process (glibc's malloc).

glibc serves every block above its mmap threshold (at most 32 MiB on 64-bit) with a fresh mmap and
unmaps it on free, so every large CPU tensor a training step makes is paid for again in page faults
and the kernel zeroing its pages on first touch: an EAGLE-3 step's (m, 8K) float32 logits are
36 MB each, several a step. On a 2-core Intel Xeon (torch 2.13 CPU build) log_softmax of an
(1100, 8192) float32 block took 11.0 ms with those faults and 4.5 ms without, and the quickstart
recipe's step 0.88 s against 0.78 s (benchmarks/train_step/README.md). `reuse_freed_memory` turns
that off for the process, as the caching allocators PyTorch's CPU tuning guides preload
(jemalloc, tcmalloc) do: `mallopt(M_MMAP_MAX, 0)` (large blocks come from the heap too) and a
high `M_TRIM_THRESHOLD` (a freed heap top is kept). After the first few steps (the heap grows until
freed blocks fit the aligned requests) a step reuses what the last one freed, so peak resident
memory stays about the same (2.78 against 2.91 GB there); memory goes back to the system when the
process ends.

Left alone: a process that is not on glibc (macOS, musl), and one whose allocator the user chose
(`LD_PRELOAD` of another malloc, or glibc's `MALLOC_*` tunables in the environment).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: keep up to 2 GiB of free heap top
USER_TUNABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                 "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def allocator_chosen_by_user(environ=os.environ) -> str | None:
    """The environment variable by which the user chose the process's allocator, or None."""
    if "malloc" in environ.get("LD_PRELOAD", "").lower():  # libjemalloc, libtcmalloc, mimalloc
        return "LD_PRELOAD"
    return next((name for name in USER_TUNABLES if name in environ), None)


def reuse_freed_memory() -> str:
    """Keep freed host memory for reuse in this process (see the module docstring); returns what
    was done, a line for the run's log."""
    chosen = allocator_chosen_by_user()
    if chosen is not None:
        return f"host memory: left to the allocator {chosen} chose"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return "host memory: not glibc, left as it is"
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "host memory: glibc refused mallopt, left as it is"
    return ("host memory: freed blocks kept for reuse (glibc mallopt; "
            "train.reuse_host_memory=false leaves the allocator as it is)")
