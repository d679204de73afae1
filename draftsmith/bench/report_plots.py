"""BENCHMARKS.md's plots per benchmark: speedup per method, acceptance per depth, held-out accuracy
against training minutes, and for a data-scaling run tau and speedup against conversations."""

from __future__ import annotations

from pathlib import Path

from draftsmith.bench.report_stats import method_names, set_mean


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(bench: dict, folder: Path) -> list[Path]:
    """speedup.png (per method, each temperature), acceptance.png (greedy, per depth) and
    training.png (held-out acc@1 against training minutes per drafter)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    names = method_names(bench)
    paths = []
    temps = list(bench["eval"])
    if temps:
        methods = list(bench["eval"][temps[0]]["summary"]["all"])
        fig, ax = plt.subplots(figsize=(9, 4))
        width = 0.8 / len(temps)
        for i, t in enumerate(temps):
            summary = bench["eval"][t]["summary"]
            ax.bar([x + i * width for x in range(len(methods))],
                   [set_mean(summary, m, "speedup") or 0 for m in methods], width,
                   label=f"temperature {t}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + width * (len(temps) - 1) / 2 for x in range(len(methods))],
                      [names.get(m, m) for m in methods], rotation=30, ha="right", fontsize=8)
        ax.set(ylabel="speedup over plain (mean over sets)", title=bench["config"]["target"])
        ax.legend()
        paths.append(_save(fig, folder / "speedup.png"))

        summary = bench["eval"][temps[0]]["summary"]
        fig, ax = plt.subplots(figsize=(7, 4))
        for m in methods:
            rates = (summary["all"][m].get("acceptance_by_depth") or [])[:6]
            if rates:
                ax.plot(range(1, len(rates) + 1), rates, marker="o", label=names.get(m, m))
        ax.set(xlabel="draft depth", ylabel="acceptance given the previous was accepted",
               ylim=(0, 1.02), title=f"Acceptance per depth, temperature {temps[0]}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        paths.append(_save(fig, folder / "acceptance.png"))
    if bench.get("curves"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, curve in bench["curves"].items():
            rec = bench["training"][label]
            points = [(r["step"] * rec["seconds_per_step"] / 60, r["eval/acc_0"])
                      for r in curve if r.get("eval/acc_0") is not None]
            if points:
                ax.plot(*zip(*points, strict=False), marker="o", label=label)
        ax.set(xlabel="training minutes (steps x the run's s/step)",
               ylabel="held-out acc@1 vs target", title="Training under the same budget")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(_save(fig, folder / "training.png"))
    scaling = scaling_points(bench)
    if scaling:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, key, label in ((axes[0], "tau", "tau (greedy, mean over sets)"),
                               (axes[1], "speedup", "speedup over plain")):
            for (minutes, length), points in scaling["drafters"].items():
                xs, ys = zip(*[(p["conversations"], p[key]) for p in points], strict=True)
                ax.plot(xs, ys, marker="o", label=f"{minutes:g} min of training"
                        + (f", {length}-token sequences" if length else ""))
            for i, (name, values) in enumerate(scaling["baselines"].items()):
                color, style = _BASELINE_STYLES[i % len(_BASELINE_STYLES)]
                ax.axhline(values[key], color=color, linestyle=style, linewidth=0.9, label=name)
            ax.set(xscale="log", xlabel="distinct conversations trained on", ylabel=label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("What data buys: one drafter kind, one budget per line")
        paths.append(_save(fig, folder / "scaling.png"))
    return paths


_BASELINE_STYLES = [("gray", "--"), ("purple", ":"), ("brown", "-."), ("olive", "--")]


def scaling_points(bench: dict) -> dict | None:
    """For a benchmark whose drafters trained on data of their own: each `drafter_dynamic@label`
    method's greedy tau and speedup against its conversations, grouped by training budget and
    sequence length (`(minutes, max_length)`, the length None where it is the benchmark's own),
    and the methods without a drafter (prompt lookup) and hybrids as reference lines. None when
    the drafters share their data or there is no greedy evaluation."""
    training = bench.get("training") or {}
    folders = {(r.get("data") or {}).get("folder") for r in training.values()}
    summary = (bench.get("eval") or {}).get("0", {}).get("summary")
    if len(folders) < 2 or not summary:
        return None
    names = method_names(bench)
    own_length = (bench.get("config") or {}).get("train", {}).get("max_length")
    drafters: dict[tuple, list[dict]] = {}
    baselines = {}
    for method in summary["all"]:
        if method == "plain":
            continue
        base, _, label = method.partition("@")
        values = {"tau": set_mean(summary, method, "tau"),
                  "speedup": set_mean(summary, method, "speedup")}
        record = training.get(label)
        if base == "drafter_dynamic" and record and (record.get("data") or {}).get("conversations"):
            length = record.get("max_length")
            drafters.setdefault((record["budget_minutes"], None if length == own_length
                                 else length), []).append(
                {"conversations": record["data"]["conversations"], **values})
        elif values["tau"] is not None:
            baselines[names.get(method, method)] = values
    for points in drafters.values():
        points.sort(key=lambda p: p["conversations"])
    return {"drafters": drafters, "baselines": baselines} if drafters else None
