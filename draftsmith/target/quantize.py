"""Quantized copies of a loaded target, for speculation over a quantized target
(`draftsmith eval --target-quant none,int8,int8wo`).

`int8wo` is weight-only int8 (`WeightOnlyInt8Linear`): the decoder's linear layers hold int8
weights with one symmetric scale per output channel, and each product runs through torch's
`_weight_int8pack_mm` with the activations kept in the target's dtype. That kernel computes every
row of its input on its own, so an n-token verify gives each row exactly what one-token decoding
gives it (tests/eval/test_target_quant.py checks it kernel by kernel): speculation over this copy
is as lossless with respect to it as over the float target (in float32 token for token; in bf16
near-ties flip in attention and norms just as for a bf16 target). Measured on a 2-core Xeon with
AMX: a (1 x 1536) @ (1536 x 8960) product 0.67 ms against 1.55 ms for the bf16 linear, 2.0 ms at
5 rows against 1.5 ms, so it pays at one token and for small trees. End to end (BENCHMARKS.md,
bf16 base, same machine) plain decoding of SmolLM2-135M ran 1.28x the bf16 target's, of
Qwen2.5-Coder-1.5B 0.83x (its 1536 x 8960 MLP products favour the AMX bf16 GEMM). With float32
activations the kernel is a slow path (10.6 ms at one row against 1.5 ms for float32; SmolLM2
plain 0.10x its float32 target), so on a CPU without native bf16 this copy is for exactness
checks, not speed.

`int8` is dynamic int8 quantization of the decoder's linear layers with torch's built-in
`torch.ao.quantization.quantize_dynamic`: int8 weights per output channel, activations quantized
per call with one scale over all of the call's rows, products through the fbgemm / x86 int8
kernels. It was picked by measurement on a 2-core AVX2 EPYC
(benchmarks/quantized_target/bench_quantized_target.py): there it is the one int8 form faster
than float32 for SmolLM2-135M.
Its price: on SmolLM2-135M its greedy choice agreed with float32's at only 38% of teacher-forced
prompt positions (weight-only: 96%), and it is not exactly lossless even with respect to
itself: the shared activation scale makes an n-token verify differ from one-token decoding (the
benchmark measured the first divergence within 0-1 new tokens on most SmolLM2 prompts). torch
marks `torch.ao.quantization` as deprecated in favour of torchao; if it goes the error below says
so.

The output head stays in the target's dtype: on tied-embedding targets (SmolLM2) it is the
embedding matrix, a fifth of the weights, and it alone decides each token.

Either copy is a different model: speculation over it verifies with the quantized model, not the
float one it was made from, and the reports say so.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch

from draftsmith.errors import DraftsmithError

QUANT_SCHEMES = {
    "none": "the target as loaded",
    "int8": "dynamic int8 linears (int8 weights per output channel, activations quantized per "
            "call; torch.ao.quantization.quantize_dynamic), output head kept float32",
    "int8wo": "weight-only int8 linears (int8 weights per output channel, activations in the "
              "target's dtype; torch _weight_int8pack_mm, row by row), output head kept as loaded",
}
# whether a scheme's n-token forward gives each row what one-token decoding gives it
ROW_INDEPENDENT = {"none": True, "int8": False, "int8wo": True}
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class QuantizedCopy:
    """A quantized copy of a model and what was done to it (eval.json records `info`)."""

    model: torch.nn.Module
    info: dict


def parse_target_quant(value: str | tuple | list) -> tuple[str, ...]:
    """`"none,int8"` (or a sequence) -> ("none", "int8"): deduplicated, `none` always first (the
    target as loaded, which every quantized copy's acceptance drop is measured against).

    Raises:
        DraftsmithError: an unknown scheme, naming it and the choices.
    """
    parts = [p.strip() for p in value.split(",")] if isinstance(value, str) else list(value)
    for part in parts:
        if part not in QUANT_SCHEMES:
            raise DraftsmithError(f"--target-quant {part!r} is not a quantization scheme; choose "
                                  f"from: {', '.join(QUANT_SCHEMES)} (comma-separated, e.g. "
                                  "--target-quant none,int8)")
    return tuple(dict.fromkeys(["none", *parts]))


def verified_output(name: str, info: dict, loaded: str) -> str:
    """Whose output a quantized variant's methods produce, and how exactly: `info` is a
    `QuantizedCopy.info` (one without `row_independent`, from an older eval.json, gets its
    scheme's), `loaded` the target as loaded in words."""
    independent = info.get("row_independent", ROW_INDEPENDENT.get(info.get("scheme", name)))
    how = ("each row of a multi-token verify is computed on its own, as in this model's one-token "
           "decoding" if independent else
           "activation scales are computed per forward over all its rows, so a multi-token "
           "verify can differ from this model's one-token decoding")
    return (f"the {name} copy of the target ({loaded}, then {info['description']}), not the "
            f"target as loaded; {how} (see identical_to_plain)")


def check_quantizable(model: torch.nn.Module, scheme: str) -> None:
    """Refuse what the int8 kernels cannot run: weights off the CPU, or not float32 for `int8`.

    Raises:
        DraftsmithError: naming the dtype or device and the flag that fixes it.
    """
    weight = next(model.parameters())
    if weight.device.type != "cpu":
        raise DraftsmithError(f"--target-quant {scheme} runs on the CPU (its int8 kernels are "
                              f"CPU kernels), the target is on {weight.device}; pass --device cpu")
    if weight.dtype not in (FLOAT_DTYPES if scheme == "int8wo" else (torch.float32,)):
        raise DraftsmithError(f"--target-quant {scheme} quantizes a float32 target, this one is "
                              f"{_dtype_name(model)}; pass --dtype float32")


def _weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights as stored: float parameters plus packed int8 linears."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, WeightOnlyInt8Linear):
            total += sum(b.numel() * b.element_size() for b in module.buffers(recurse=False))
        elif isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            weight = module.weight()
            scales, zeros = weight.q_per_channel_scales(), weight.q_per_channel_zero_points()
            total += weight.numel() + scales.numel() * scales.element_size() \
                + zeros.numel() * zeros.element_size()
    return total


class WeightOnlyInt8Linear(torch.nn.Module):
    """A linear layer with int8 weights (one symmetric scale per output channel) whose product runs
    row by row in the input's dtype (`torch._weight_int8pack_mm`): row-independent, so verifying n
    tokens at once gives each what one-token decoding gives it."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qweight", torch.round(weight / scales[:, None])
                             .clamp(-127, 127).to(torch.int8).contiguous())
        self.register_buffer("scales", scales.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else torch.nn.Parameter(
            linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        y = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scales.to(x.dtype))
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def _weight_only_int8(model: torch.nn.Module, chosen: list[str]) -> torch.nn.Module:
    """A copy of `model` with each linear named in `chosen` replaced by `WeightOnlyInt8Linear`."""
    chosen = set(chosen)
    memo = {id(module): WeightOnlyInt8Linear(module)  # deepcopy takes these in their place
            for name, module in model.named_modules() if name in chosen}
    return copy.deepcopy(model, memo)


def _dynamic_int8(model: torch.nn.Module, chosen: list[str], scheme: str) -> torch.nn.Module:
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError as err:
        raise DraftsmithError(f"--target-quant {scheme} needs torch.ao.quantization, which this "
                              f"torch {torch.__version__} lacks: {err}") from err
    with warnings.catch_warnings():  # its deprecation notices; the module docstring says why
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, dict.fromkeys(chosen, per_channel_dynamic_qconfig),
                                dtype=torch.qint8, inplace=False)


def _dtype_name(model: torch.nn.Module) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def quantize_model(model: torch.nn.Module, scheme: str, *, quantize_head: bool = False,
                   keep_float: tuple[str, ...] = ()) -> QuantizedCopy:
    """A quantized copy of `model` (the original is left as it is).

    Args:
        model: a transformers causal LM on the CPU, in eval mode: float32 for `int8`, float32,
            bfloat16 or float16 for `int8wo` (its activations keep that dtype).
        scheme: a key of `QUANT_SCHEMES` other than `none`.
        quantize_head: also quantize the output head (the benchmark's comparison; eval keeps it
            float, see the module docstring).
        keep_float: name suffixes of linears left float (the benchmark's per-layer comparison,
            e.g. `("down_proj",)`).

    Returns:
        The copy (eval mode, no grads) and `info`: scheme, method, whether its rows are computed
        independently, the linears quantized and kept float, and the weight bytes before and
        after.

    Raises:
        DraftsmithError: an unknown scheme, a target the kernels cannot run, or a torch without
            `torch.ao.quantization`.
    """
    if scheme not in QUANT_SCHEMES or scheme == "none":
        raise DraftsmithError(f"cannot quantize with {scheme!r}; choose from: "
                              f"{', '.join(s for s in QUANT_SCHEMES if s != 'none')}")
    check_quantizable(model, scheme)
    head = model.get_output_embeddings()
    names = {module: name for name, module in model.named_modules()}
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    chosen = [names[m] for m in linears if (quantize_head or m is not head)
              and not names[m].endswith(keep_float)]
    if scheme == "int8wo":
        quantized = _weight_only_int8(model, chosen)
        method = (f"torch {torch.__version__} torch.ops.aten._weight_int8pack_mm (int8 weights, "
                  f"per-channel scales, {_dtype_name(model)} activations, row by row)")
    else:
        quantized = _dynamic_int8(model, chosen, scheme)
        method = (f"torch {torch.__version__} torch.ao.quantization.quantize_dynamic (qint8, "
                  f"per-channel weights, engine {torch.backends.quantized.engine})")
    quantized.eval().requires_grad_(False)
    info = {"scheme": scheme, "description": QUANT_SCHEMES[scheme], "method": method,
            "row_independent": ROW_INDEPENDENT[scheme],
            "quantized_linears": len(chosen),
            "float_linears": [names[m] for m in linears if names[m] not in chosen],
            "head_quantized": quantize_head,
            "weight_bytes_before": _weight_bytes(model),
            "weight_bytes_after": _weight_bytes(quantized)}
    return QuantizedCopy(quantized, info)
