"""Device memory by name: a few common GPUs, a plain size (`80GB`, `24GiB`) or `cpu` (this
machine's RAM), for `draftsmith plan --gpu`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from draftsmith.errors import DraftsmithError

GB = 10**9
GIB = 2**30

# memory as the vendor sells it (GB of 10^9 bytes on the box); what torch can allocate is a
# little less (the CUDA context; see memory.RUNTIME_BYTES)
GPUS: dict[str, int] = {
    "a100-40gb": 40 * GB,
    "a100-80gb": 80 * GB,
    "h100-80gb": 80 * GB,
    "h200-141gb": 141 * GB,
    "l40s-48gb": 48 * GB,
    "rtx4090-24gb": 24 * GB,
}


@dataclass(frozen=True)
class Device:
    """What a plan is sized for.

    Attributes:
        name: as given (`h100-80gb`, `80GB`, `cpu`).
        kind: `cuda` or `cpu` (decides the attention kernel the loop gets and the runtime cost).
        memory: bytes per rank.
    """

    name: str
    kind: str
    memory: int


def parse_device(name: str) -> Device:
    """A GPU name from `GPUS`, a size like `80GB` / `80GiB` / `24gb` (a GPU of that memory) or
    `cpu` (this machine's RAM).

    Raises:
        DraftsmithError: anything else, listing the names and the size form.
    """
    text = name.strip().lower()
    if text in GPUS:
        return Device(name, "cuda", GPUS[text])
    if text == "cpu":
        return Device(name, "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    size = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(gb|gib)", text)
    if size and float(size.group(1)) > 0:
        unit = GIB if size.group(2) == "gib" else GB
        return Device(name, "cuda", int(float(size.group(1)) * unit))
    raise DraftsmithError(f"--gpu {name!r}: unknown GPU; use one of {', '.join(GPUS)}, a memory "
                          "size such as 80GB or 24GiB, or cpu (this machine's RAM)")
