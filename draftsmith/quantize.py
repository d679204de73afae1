"""Quantized copies of a loaded target, for speculation over a quantized target
(`draftsmith eval --target-quant none,int8`).

`int8` is dynamic int8 quantization of the decoder's linear layers (attention and MLP
projections) with torch's built-in `torch.ao.quantization.quantize_dynamic`: int8 weights with
one symmetric scale per output channel, activations quantized per call, products through the
fbgemm / x86 int8 kernels. It was picked by measurement on a 2-core AVX2 EPYC
(scripts/bench_quantized_target.py, benchmarks/quantized_target/): there it is the one int8 form
faster than float32 for SmolLM2-135M, at one token and in multi-token verification forwards,
while torchao's eager int8 forms (weight-only, dynamic activations) were no faster or slower.
The price is fidelity: on SmolLM2-135M its greedy choice agreed with float32's at only 38% of
teacher-forced prompt positions (torchao weight-only: 96%), so the int8 target is a markedly
different model and a drafter trained on the float one loses acceptance against it.
torch marks `torch.ao.quantization` as deprecated in favour of torchao; it still ships in torch
2.13, and if it goes the error below says so.

The output head stays float32: on tied-embedding targets (SmolLM2) it is the embedding matrix, a
fifth of the weights, and it alone decides each token; the benchmark measures what quantizing it
too would save and how often it changes the greedy choice.

The copy is a different model: speculation over it verifies with the quantized model, not the float
one it was made from. And it is not exactly lossless even with respect to the quantized model:
dynamic int8 quantizes each forward's activations with one scale over all of its rows, so an
n-token verify is not bit-identical to one-token decoding. On a tiny random target the outputs
still match (tests/eval/test_target_quant.py); on SmolLM2 the benchmark measured the first
divergence within 0-1 new tokens on most prompts (BENCHMARKS.md, quantized run). A row-independent
weight-only int8 would be exact; it is not built yet.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from draftsmith.errors import DraftsmithError

QUANT_SCHEMES = {
    "none": "the target as loaded",
    "int8": "dynamic int8 linears (int8 weights per output channel, activations quantized per "
            "call; torch.ao.quantization.quantize_dynamic), output head kept float32",
}


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


def check_quantizable(model: torch.nn.Module, scheme: str) -> None:
    """Refuse what the int8 kernels cannot run: weights off the CPU or not float32.

    Raises:
        DraftsmithError: naming the dtype or device and the flag that fixes it.
    """
    weight = next(model.parameters())
    if weight.device.type != "cpu":
        raise DraftsmithError(f"--target-quant {scheme} runs on the CPU (its int8 kernels are "
                              f"CPU kernels), the target is on {weight.device}; pass --device cpu")
    if weight.dtype != torch.float32:
        raise DraftsmithError(f"--target-quant {scheme} quantizes a float32 target, this one is "
                              f"{str(weight.dtype).removeprefix('torch.')}; pass --dtype float32")


def _weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights as stored: float parameters plus packed int8 linears."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            weight = module.weight()
            scales, zeros = weight.q_per_channel_scales(), weight.q_per_channel_zero_points()
            total += weight.numel() + scales.numel() * scales.element_size() \
                + zeros.numel() * zeros.element_size()
    return total


def quantize_model(model: torch.nn.Module, scheme: str, *, quantize_head: bool = False,
                   keep_float: tuple[str, ...] = ()) -> QuantizedCopy:
    """A quantized copy of `model` (the original is left as it is).

    Args:
        model: a float32 transformers causal LM on the CPU, in eval mode.
        scheme: a key of `QUANT_SCHEMES` other than `none`.
        quantize_head: also quantize the output head (the benchmark's comparison; eval keeps it
            float, see the module docstring).
        keep_float: name suffixes of linears left float (the benchmark's per-layer comparison,
            e.g. `("down_proj",)`).

    Returns:
        The copy (eval mode, no grads) and `info`: scheme, method, the linears quantized and kept
        float, and the weight bytes before and after.

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
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError as err:
        raise DraftsmithError(f"--target-quant {scheme} needs torch.ao.quantization, which this "
                              f"torch {torch.__version__} lacks: {err}") from err
    with warnings.catch_warnings():  # its deprecation notices; the module docstring says why
        warnings.simplefilter("ignore")
        quantized = quantize_dynamic(model, dict.fromkeys(chosen, per_channel_dynamic_qconfig),
                                     dtype=torch.qint8, inplace=False)
    quantized.eval().requires_grad_(False)
    info = {"scheme": scheme, "description": QUANT_SCHEMES[scheme],
            "method": f"torch {torch.__version__} torch.ao.quantization.quantize_dynamic "
                      f"(qint8, per-channel weights, engine {torch.backends.quantized.engine})",
            "quantized_linears": len(chosen),
            "float_linears": [names[m] for m in linears if names[m] not in chosen],
            "head_quantized": quantize_head,
            "weight_bytes_before": _weight_bytes(model),
            "weight_bytes_after": _weight_bytes(quantized)}
    return QuantizedCopy(quantized, info)
