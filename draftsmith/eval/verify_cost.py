"""What verification costs on this machine: the target's forward time for n new tokens on a cached
context, relative to one token, with the few-row linear form off and on (`draftsmith machine`).

Speculative decoding pays only where a forward of n tokens costs little more than one; the curve
is a property of the CPU/GPU, the BLAS and the dtype, so it is measured, written to a file
(`verify_cost.json` and a plot) and reported next to the hardware it was measured on.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from draftsmith.decoding.few_row_linear import (
    few_row_limits,
    has_float32_linears,
    install_few_row_linear,
)
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.errors import DraftsmithError
from draftsmith.eval.autotune import measure_verify_cost
from draftsmith.target.precision import describe_hardware, hardware_record

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)


def measure_machine(target, device: str = "cpu", sizes: tuple[int, ...] = SIZES,
                    context_len: int = 200, repeats: int = 3, rounds: int = 4) -> dict:
    """The verify-cost curve of `target` (a loaded `draftsmith.target.load.Target`) on this machine.

    Returns:
        {"hardware", "machine", "target", "context_len", "repeats", "curves": {"default": {n:
        ms}, "few_row": {n: ms}}, "few_row_limits"}: each time is the minimum of `rounds` x
        `repeats` timings, the two forms measured in alternation.

    Raises:
        DraftsmithError: `context_len` below 1, or with the largest size beyond the target's
            context length (checked before measuring).
    """
    model = target.model
    check_context(context_len, max(sizes), getattr(model.config, "max_position_embeddings", None))
    forms = (("default", 0), ("few_row", None)) if has_float32_linears(model) else \
        (("default", 0),)  # the skinny form exists for float32 CPU linears only
    curves: dict[str, dict[int, float]] = {name: {} for name, _ in forms}
    for _ in range(rounds):  # alternate the two forms so that drift of a busy machine hits both
        for name, limit in forms:
            install_few_row_linear(model, max_rows=limit)
            runner = CausalLMRunner(model, few_row_linear=False)
            costs = measure_verify_cost(runner, list(sizes), context_len, repeats, reduce=min)
            for n, seconds in costs.items():
                curves[name][n] = min(seconds, curves[name].get(n, float("inf")))
    machine = hardware_record(device, target.dtype_choice)
    return {
        "hardware": describe_hardware(machine),
        "machine": machine,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": target.spec,
        "context_len": context_len,
        "repeats": repeats * rounds,
        "curves": {name: {n: round(s * 1e3, 2) for n, s in curve.items()}
                   for name, curve in curves.items()},
        "few_row_limits": few_row_limits(model),
    }


def check_context(context_len: int, largest: int, max_positions: int | None) -> None:
    """`--context` is at least 1 and, with the largest forward, within the target's positions.

    Raises:
        DraftsmithError: naming `--context`, the limit and the fix.
    """
    if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
        raise DraftsmithError(f"--context {context_len!r} must be an integer >= 1 (tokens cached "
                              "before each timed forward), e.g. --context 200")
    if max_positions and context_len + largest > max_positions:
        raise DraftsmithError(f"--context {context_len} plus the largest forward ({largest} "
                              f"tokens) exceeds the target's context length of {max_positions} "
                              f"tokens; pass --context {max_positions - largest} or less")


def single_curve(payload: dict) -> dict[int, float] | None:
    """The one curve of a machine where the few-row form does not apply (no float32 linears, so
    both recorded forms, if any, ran the same code): the minimum over them per size."""
    if payload.get("few_row_limits"):
        return None
    curves = list(payload["curves"].values())
    return {n: min(c[n] for c in curves if n in c) for n in curves[0]}


def format_curve(payload: dict) -> str:
    """A markdown table: n, ms and ratio to one token, default and few-row (one column pair
    where the few-row form does not apply)."""
    single = single_curve(payload)
    if single is not None:
        one = single[min(single)]
        return "\n".join(["| new tokens | ms | / 1 token |", "|---|---|---|",
                          *[f"| {n} | {ms:.1f} | {ms / one:.2f}x |" for n, ms in single.items()]])
    default, few = payload["curves"]["default"], payload["curves"]["few_row"]
    rows = ["| new tokens | default ms | default / 1 token | few-row ms | few-row / 1 token |",
            "|---|---|---|---|---|"]
    one_d, one_f = default[1], few[1]
    for n in default:
        rows.append(f"| {n} | {default[n]:.1f} | {default[n] / one_d:.2f}x | {few[n]:.1f} | "
                    f"{few[n] / one_f:.2f}x |")
    return "\n".join(rows)


def plot_curve(payload: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    single = single_curve(payload)
    forms = [(single, "torch default")] if single is not None else \
        [(payload["curves"][name], label) for name, label in
         (("default", "torch default"), ("few_row", "few-row linear (adopted)"))]
    for curve, label in forms:
        curve = {int(n): v for n, v in curve.items()}
        sizes = sorted(int(n) for n in curve)
        ax.plot(sizes, [curve[n] / curve[1] for n in sizes], marker="o", label=label)
    ax.set_xlabel("new tokens in one target forward")
    ax.set_ylabel("time / one-token forward")
    ax.set_title(f"{payload['target']}: verify cost, {payload['machine'].get('dtype', '?')}",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
