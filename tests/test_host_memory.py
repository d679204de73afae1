"""Freed host memory kept for reuse (draftsmith/host_memory.py): a large tensor made again after
one was freed faults no new pages in, the user's own allocator choice is left alone, and a
process that is not on glibc is told so."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from draftsmith.host_memory import allocator_chosen_by_user

# a 36 MB float32 block (a step's (1100, 8192) logits) made by log_softmax and freed, 16 times:
# the minor page faults of the last 4 (the heap grows for the first few, memalign's padding)
PROBE = """
import json, resource, sys, torch
from draftsmith.host_memory import reuse_freed_memory
line = reuse_freed_memory() if sys.argv[1] == "reuse" else "as it is"
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
x = torch.randn(1100, 8192)
for round in range(16):
    if round == 12:
        before = faults()
    torch.log_softmax(x, -1)
print(json.dumps({"line": line, "faults": faults() - before}))
"""


def _probe(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")
           and k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_freed_large_tensor_is_reused_without_new_page_faults():
    plain, reused = _probe("plain"), _probe("reuse")
    assert plain["faults"] > 4 * 8_000  # 36 MB is 8.8K pages, faulted in again each time
    assert reused["line"].startswith("host memory: freed blocks kept for reuse")
    assert reused["faults"] < 1_000, reused


def test_the_users_allocator_choice_is_left_alone():
    assert allocator_chosen_by_user({}) is None
    assert allocator_chosen_by_user({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == "LD_PRELOAD"
    assert allocator_chosen_by_user({"LD_PRELOAD": "/opt/libtcmalloc_minimal.so"}) == "LD_PRELOAD"
    assert allocator_chosen_by_user({"LD_PRELOAD": "/lib/libfoo.so"}) is None
    assert allocator_chosen_by_user({"MALLOC_ARENA_MAX": "2"}) is None
    assert allocator_chosen_by_user({"MALLOC_TRIM_THRESHOLD_": "0"}) == "MALLOC_TRIM_THRESHOLD_"
