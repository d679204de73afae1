"""Writing evaluation results: a terminal table, a JSON file and PNG plots."""

from __future__ import annotations

import math
from pathlib import Path

from draftsmith.target.quantize import verified_output


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return format("-", ">" + spec.split(".")[0])
    return format(value, spec)


def format_table(table: dict[str, dict[str, dict]], names: dict[str, str] | None = None) -> str:
    """Rows: set x method; columns: tau, tokens/s, speedup, acceptance at depths 1-3, per-token
    latency p50 / p90 / p99 and time to first token (p50), with the number of runs. `names`:
    method -> the name shown (`Method.display_name`; default: the method)."""
    names = names or {}
    width = max([10, *(len(name) for name in table)])
    label = max([18, *(len(names.get(m, m)) for rows in table.values() for m in rows)])
    header = (f"{'set':{width}s} {'method':{label}s} {'runs':>4s} {'tau':>5s} {'tok/s':>7s} "
              f"{'speedup':>8s} {'acc@1':>6s} {'acc@2':>6s} {'acc@3':>6s} {'p50 ms':>7s} "
              f"{'p90 ms':>7s} {'p99 ms':>7s} {'TTFT ms':>8s}")
    lines = [header, "-" * len(header)]
    for set_name, methods in table.items():
        for method, s in methods.items():
            acc = (s["acceptance_by_depth"] + [None] * 3)[:3]
            lines.append(
                f"{set_name:{width}s} {names.get(method, method):{label}s} {s['runs']:4d} {_fmt(s['tau'], '5.2f')} "
                f"{_fmt(s['tokens_per_second'], '7.1f')} {_fmt(s['speedup'], '7.2f')}x "
                f"{_fmt(acc[0], '6.2f')} {_fmt(acc[1], '6.2f')} {_fmt(acc[2], '6.2f')} "
                f"{_fmt(s['latency_ms_p50'], '7.1f')} {_fmt(s['latency_ms_p90'], '7.1f')} "
                f"{_fmt(s.get('latency_ms_p99'), '7.1f')} {_fmt(s.get('ttft_ms_p50'), '8.1f')}"
            )
    return "\n".join(lines)



def write_plots(table: dict[str, dict[str, dict]], out_dir: Path,
                names: dict[str, str] | None = None) -> list[Path]:
    """acceptance_by_depth.png (overall) and speedup_by_set.png, methods shown by `names`
    (method -> display name); returns the written paths."""
    names = names or {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, s in table["all"].items():
        rates = s["acceptance_by_depth"]
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=names.get(method, method))
    ax.set(xlabel="draft depth", ylabel="acceptance rate (given the previous was accepted)",
           ylim=(0, 1.02), title="Acceptance per depth (all sets)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "acceptance_by_depth.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8.5, 4))
    sets = list(table)
    methods = list(table["all"])
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        values = [table[s].get(method, {}).get("speedup") or 0.0 for s in sets]
        ax.bar([x + i * width for x in range(len(sets))], values, width,
               label=names.get(method, method))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(sets))], sets)
    ax.set(ylabel="speedup over plain decoding", title="Speedup per prompt set")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    paths.append(out_dir / "speedup_by_set.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def format_batch_table(curve: dict[str, dict[str, dict]]) -> str:
    """Rows: batch size x method; columns: tokens/s, speedup against plain at that batch size, tau
    and the rows decoded."""
    width = max([18, *(len(m) for rows in curve.values() for m in rows)])
    header = f"{'batch':>5s} {'method':{width}s} {'rows':>5s} {'tok/s':>8s} {'speedup':>8s} {'tau':>5s}"
    lines = [header, "-" * len(header)]
    for size, rows in curve.items():
        for method, s in rows.items():
            lines.append(f"{size:>5s} {method:{width}s} {s['rows']:5d} "
                         f"{_fmt(s['tokens_per_second'], '8.1f')} {_fmt(s['speedup'], '7.2f')}x "
                         f"{_fmt(s['tau'], '5.2f')}")
    return "\n".join(lines)


def write_batch_plot(curve: dict[str, dict[str, dict]], out_dir: Path) -> Path:
    """speedup_by_batch_size.png: each method's speedup over plain decoding against batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    methods = list(dict.fromkeys(m for rows in curve.values() for m in rows))
    fig, ax = plt.subplots(figsize=(6, 4))
    for method in methods:
        points = [(int(size), rows[method]["speedup"]) for size, rows in curve.items()
                  if method in rows and rows[method]["speedup"] is not None]
        if points and method != "plain":
            ax.plot(*zip(*points, strict=True), marker="o", label=method)
    ax.axhline(1.0, color="black", linewidth=0.8, label="plain")
    sizes = [int(s) for s in curve]
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set(xlabel="batch size", ylabel="speedup over plain decoding (same batch size)",
           title="Speedup against batch size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "speedup_by_batch_size.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def format_variant_table(variants: dict[str, dict]) -> str:
    """The target variants side by side (all sets): per variant and method tau, tokens/s, speedup
    against that variant's plain decoding, acceptance at depths 1-3, the tau and depth-1
    acceptance drop against the target as loaded and tokens/s against its plain decoding; then
    what each variant's output is."""
    width = max([18, *(len(m) for v in variants.values() for m in v["summary"]["all"])])
    header = (f"{'target':8s} {'method':{width}s} {'tau':>5s} {'tok/s':>7s} {'speedup':>8s} "
              f"{'acc@1':>6s} {'acc@2':>6s} {'acc@3':>6s} {'tau drop':>8s} {'acc@1 drop':>10s} "
              f"{'vs none plain':>13s}")
    lines = ["target variants: speedup against the same target's plain decoding; drops (positive "
             "= fewer accepted) and tokens/s against the target as loaded (none)",
             header, "-" * len(header)]
    for name, variant in variants.items():
        for method, s in variant["summary"]["all"].items():
            acc = (s["acceptance_by_depth"] + [None] * 3)[:3]
            lines.append(
                f"{name:8s} {method:{width}s} {_fmt(s['tau'], '5.2f')} "
                f"{_fmt(s['tokens_per_second'], '7.1f')} {_fmt(s['speedup'], '7.2f')}x "
                f"{_fmt(acc[0], '6.2f')} {_fmt(acc[1], '6.2f')} {_fmt(acc[2], '6.2f')} "
                f"{_fmt(s.get('tau_drop'), '8.2f')} "
                f"{_fmt((s.get('acceptance_drop_by_depth') or [None])[0], '10.2f')} "
                f"{_fmt(s.get('speedup_vs_loaded_plain', s['speedup']), '12.2f')}x")
    loaded = (variants.get("none") or {}).get("verified_output", "").removeprefix(
        "the target as loaded: ")
    for name, variant in variants.items():  # results written before `row_independent` was
        info = variant["quantization"]      # recorded get today's wording of what they measured
        text = variant["verified_output"] if info is None or "row_independent" in info \
            else verified_output(name, info, loaded)
        lines.append(f"{name}: verified output is {text}")
    return "\n".join(lines)


def identical_lines(identical: dict[str, tuple[int, int]], dtype: str) -> list[str]:
    """The greedy run's footer: how often each method's output equals plain decoding's, and, when
    a method parted from it outside float32, what that means and the command that checks it.

    Args:
        identical: method -> (outputs identical to plain, outputs compared).
        dtype: the dtype the target decoded in.
    """
    lines = ["identical to plain greedy output: " + ", ".join(
        f"{m} {s / c:.0%}" for m, (s, c) in identical.items() if c)]
    if dtype != "float32" and any(s < c for s, c in identical.values()):
        lines.append(f"  (in {dtype}, logits that nearly tie can rank differently in a multi-token "
                     "verify than in plain decoding's one-token forward, so an output can part "
                     "from plain decoding after its first new token (every method takes that "
                     "one from the same prefill) without a bug; the same "
                     "run with --check-lossless decodes in float32 and requires every output "
                     "identical)")
    return lines
