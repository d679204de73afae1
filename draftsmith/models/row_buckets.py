"""Row counts rounded up to a bucket at every linear layer, so a CPU's bf16 matmuls reuse kernels.

On a CPU, torch runs bfloat16 matmuls through oneDNN, which builds (JIT-compiles) a kernel for
every new problem shape and caches it. Training feeds linears a different row count nearly every
time: token batches of varying (B, T), EAGLE-3's packed training-time-test steps (each step its own
row count), the rows each head trains. On a 2-core Intel Xeon with AMX (torch 2.13) a
(1211, 1536) x (1536, 576) bf16 product took 1.7 ms with its kernel cached and 5.0 ms when its
row count was new; rounded up to a multiple of 64, every call found its kernel (1.3 ms: the
multiple is also the faster shape). Float32 goes through MKL, which builds nothing per shape;
a GPU's cuBLAS neither: there the padding is only waste, so it is on where bf16 runs on a CPU.

`bucket_rows(module, multiple)` pads the input of every `nn.Linear` under `module` with zero rows
up to the next multiple and slices the output back (forward hooks: parameters, names and state
dicts are untouched; the padded rows get no gradient). A hook reads only shapes: no device read.
"""

from __future__ import annotations

import torch
from torch import nn

DEFAULT_MULTIPLE = 64


def _pad_input(module: nn.Linear, args):
    x = args[0]
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    pad = -rows % module._row_bucket
    if rows == 0 or pad == 0:
        module._bucketed_shape = None
        return None
    module._bucketed_shape = x.shape
    flat = x.reshape(rows, width)  # one copy with the zero rows (F.pad fills, then copies)
    return (torch.cat([flat, flat.new_zeros(pad, width)]), *args[1:])


def _slice_output(module: nn.Linear, args, output: torch.Tensor):
    shape = module._bucketed_shape
    if shape is None:
        return None
    module._bucketed_shape = None
    return output[:shape.numel() // shape[-1]].reshape(*shape[:-1], output.shape[-1])


def bucket_rows(module: nn.Module, multiple: int = DEFAULT_MULTIPLE) -> int:
    """Round the row count of every `nn.Linear` under `module` up to `multiple` (see the module
    docstring); returns how many linears (0: none, or `multiple` <= 1, which leaves them as they
    are). Applying it twice keeps one pair of hooks per linear."""
    if multiple <= 1:
        return 0
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    for linear in linears:
        if getattr(linear, "_row_bucket", None) is None:
            linear.register_forward_pre_hook(_pad_input)
            linear.register_forward_hook(_slice_output)
        linear._row_bucket = multiple
    return len(linears)
