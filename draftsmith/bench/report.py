"""BENCHMARKS.md and its plots, generated from each target's bench.json: nothing typed by hand.

Headline numbers are means over the prompt sets (MT-bench, HumanEval, GSM8K), each set weighted
equally, as the bars are stated; every per-set number is in the eval.json next to it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import yaml

from draftsmith.bench.engine_stage import engine_folder
from draftsmith.bench.report_findings import bars, limits, ordering, paired_differences
from draftsmith.bench.report_plots import write_plots
from draftsmith.bench.report_sections import (
    engine_section,
    lossless_line,
    passes_section,
    regenerated_line,
)
from draftsmith.bench.report_sections import fmt as _fmt
from draftsmith.bench.report_stats import (
    SETS_ORDER,
    depth_rates,
    draft_share,
    method_names,
    set_mean,
)
from draftsmith.eval.methods import Method
from draftsmith.eval.results import (
    BenchResults,
    EvalResults,
    Summary,
    TrainingRecord,
    read_bench_results,
    write_bench_results,
)


def _trees(bench: BenchResults) -> str:
    """How the dynamic trees were shaped: fixed, or autotuned per method (from eval.json)."""
    cfg = bench.config["eval"]
    if not cfg.get("autotune_tree"):
        return f"Dynamic trees: {cfg['tree']}."
    picks = _tree_picks(bench, {f" (T={t})": run for t, run in bench.eval.items()})
    return (f"Dynamic trees autotuned per method on this machine (top-{cfg['tree']['topk']}; a "
            f"block drafter's depth is its block length, its chain's too): {picks}.")


def _tree_picks(bench: BenchResults, runs: dict[str, EvalResults]) -> str:
    """`method: depth D x N tokens` for each autotuned tree of the evaluation `runs` (keyed by
    a suffix naming the run, e.g. the temperature)."""
    names = method_names(bench)
    chosen = {}
    for suffix, run in runs.items():
        for method, b in run.tree_budgets.items():
            chosen.setdefault(names.get(method, method), []).append(
                f"depth {b['depth']} x {b['total_tokens']} tokens{suffix}")
    return "; ".join(f"{m}: {', '.join(v)}" for m, v in chosen.items())


def _eval_table(bench: BenchResults, temperature: str) -> list[str]:
    return method_table(bench, bench.eval[temperature].summary, float(temperature) == 0)


def titled_passes(bench: BenchResults) -> list[str]:
    """Each pass with a `title`: its own method table (its speedups against its own plain runs)."""
    lines = []
    specs = bench.config["eval"].get("passes") or {}
    for name, result in bench.passes.items():
        title = (specs.get(name) or {}).get("title")
        if not title:
            continue
        cfg = result.config
        sets = (specs.get(name) or {}).get("bench")
        lines += [f"### {title} (`{name}` run, greedy, "
                  + (f"prompts: {', '.join(sets)}, " if sets else "")
                  + f"{cfg.get('limit')} prompt(s) per set, "
                  f"{cfg.get('max_new_tokens')} new tokens per turn; speedups against this run's "
                  "plain decoding)", "", *method_table(bench, result.summary, True), "",
                  *([f"Trees sized for this machine: {_tree_picks(bench, {'': result})}.", ""]
                    if result.tree_budgets else []),
                  *([*lossless_line(result.lossless_check), ""]
                    if cfg.get("check_lossless") else [])]
    return lines


def method_table(bench: BenchResults, summary: Summary, greedy: bool) -> list[str]:
    """Every method of one evaluation run: tau, acceptance, speed, draft-time share."""
    sets = [s for s in SETS_ORDER if s in summary] + \
        [s for s in summary if s not in SETS_ORDER and s != "all"]
    head = ("| method | tau | acc@1 | acc@2 | acc@3 | tokens/s | speedup | "
            + " | ".join(f"speedup {s}" for s in sets)
            + " | draft time |" + (" identical to plain |" if greedy else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    names = method_names(bench)
    for method in summary["all"]:
        acc = depth_rates(summary, method)
        cells = [names.get(method, method), _fmt(set_mean(summary, method, "tau")),
                 *[_fmt(a) for a in acc], _fmt(set_mean(summary, method, "tokens_per_second"), ".1f"),
                 f"**{_fmt(set_mean(summary, method, 'speedup'))}x**",
                 *[_fmt(summary[s].get(method, {}).get("speedup")) + "x" for s in sets],
                 _fmt(draft_share(summary, method), ".0%")]
        if greedy:
            same = summary["all"][method].get("identical_to_plain")
            cells.append(_fmt(same, ".0%", "reference"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def shared_head(record: TrainingRecord) -> bool:
    """Whether a Medusa drafter's heads used the target's own output layer (`shared_head`), from
    its budget record or, for older records, the recipe it trained with."""
    if record.shared_head is not None:
        return record.shared_head
    recipe = Path(record.recipe)
    if record.kind != "medusa" or not recipe.is_file():
        return False
    return bool((yaml.safe_load(recipe.read_text()).get("drafter") or {}).get("shared_head"))


def _own_data(records: dict[str, TrainingRecord]) -> bool:
    """Some drafters trained on data of their own (a data-scaling run); a record written before
    records named their data counts as the shared data's."""
    return len({r.data["folder"] for r in records.values()
                if (r.data or {}).get("folder")}) > 1


def _steps_note(bench: BenchResults) -> str:
    """How the run's steps were set: by the training's own planner (`train.max_minutes`, records
    since it) or by a calibration's fixed count (older records)."""
    if all(rec.calibrated_seconds_per_step is not None for rec in bench.training.values()):
        return ("Steps = what each run's own planner (`train.max_minutes`) fitted in the budget "
                "at the pace it measured; s/step = measured over the run")
    return "Steps = budget / the calibrated seconds per step"


def _budgets(bench: BenchResults) -> str:
    """The drafters' wall-clock budgets: the benchmark's, or each one's where they differ."""
    budgets = sorted({rec.budget_minutes for rec in bench.training.values()}
                     or {bench.config["budget_minutes"]})
    return " / ".join(f"{b:g}" for b in budgets)


def _training_table(bench: BenchResults) -> list[str]:
    records = bench.training
    own_data = _own_data(records)  # then the conversations each trained on
    seen_only = not own_data and any(r.tokens_seen for r in records.values())
    lines = ["| drafter | kind | trained params | features | "
             + ("conversations | tokens | tokens seen (epochs) | " if own_data else
                "tokens seen (epochs) | " if seen_only else "")
             + "steps | batch | s/step | tokens/s | train minutes | held-out acc@1 | acc@2 | acc@3 | "
             "simulated tau |", "|" + "---|" * (13 + (3 if own_data else seen_only))]
    for label, rec in records.items():
        held, data, seen = rec.held_out, rec.data or {}, rec.tokens_seen
        epochs = f" ({seen / data['tokens']:.2f})" if seen and data.get("tokens") else ""
        regenerated = (f" ({data['regenerated']:,} answered by the target)"
                       if data.get("regenerated") else "")
        columns = [_fmt(data.get("conversations"), ",d") + regenerated, _fmt(data.get("tokens"), ",d"),
                   _fmt(seen, ",d") + epochs] if own_data else \
            [_fmt(seen, ",d") + epochs] if seen_only else []
        extends = rec.extends
        lines.append("| " + " | ".join([
            label + (f" ({extends['label']} trained on from its step {extends['step']:,})"
                     if extends else ""), rec.kind + (" + LoRA" if rec.lora else "")
            + (" (heads share the target's frozen output layer)" if shared_head(rec) else ""),
            _fmt((rec.trainable_params or 0) / 1e6, ".1f") + "M", rec.features,
            *columns, str(rec.steps), str(rec.batch_size), _fmt(rec.seconds_per_step),
            _fmt(rec.tokens_per_second, ".0f"), _fmt(rec.train_minutes, ".1f"),
            _fmt(held.get("acc_0")), _fmt(held.get("acc_1")),
            _fmt(held.get("acc_2")), _fmt(held.get("simulated_tau"))]) + " |")
    return lines


def target_section(bench: BenchResults, folder: Path, overhead: dict | None) -> list[str]:
    """The markdown of one target."""
    cfg = bench.config
    first = next(iter(bench.eval.values()), None)
    data = bench.data or {}
    rendering = data.get("rendering") or {}
    cache = data.get("cache") or {}
    regenerated = bool((data.get("data") or {}).get("regenerate"))
    name = bench_name(cfg)
    shared = ("**Data** (shared by the drafters without data of their own, whose conversations "
              "the training table lists): " if _own_data(bench.training) else
              "**Data** (shared by every drafter): ")
    lines = [f"## {cfg['target']}" + (f" ({name})" if name != cfg["target"] else ""), "",
             f"Measured on {_measured(first)}; "
             f"{(first.machine.get('dtype') if first else None) or cfg['dtype']}, "
             f"batch 1. Config: `{cfg['path']}`. Raw results: `{folder}/`.", "",
             shared + f"{_fmt(rendering.get('rendered'), ',')} conversations, "
             f"{_fmt(rendering.get('tokens'), ',')} tokens, {_fmt(rendering.get('masked_tokens'), ',')} "
             f"in the loss, {regenerated_line(data) if regenerated else 'responses as written (labels are the target logits)'}; "
             f"hidden-state cache {_fmt(cache.get('bytes_per_token'), ',.0f')} bytes/token. "
             f"Prompts: {', '.join(cfg['eval']['bench'])}, {cfg['eval']['limit']} item(s) each "
             f"(MT-bench: both turns), {cfg['eval']['max_new_tokens']} new tokens per turn. "
             f"{_trees(bench)} Chains: {cfg['eval']['num_draft_tokens']} tokens; static trees: "
             "13 nodes, depth 5.", "",
             f"### Training: {_budgets(bench)} wall-clock minutes per drafter on this machine",
             "", *_training_table(bench), "",
             _steps_note(bench) + "; tokens/s = real (unpadded) "
             "tokens trained per wall second over the run's steps (its held-out evaluations and "
             "checkpoints included); train minutes = the run's own wall-clock budget "
             "spent, from building the drafter to saving it, over all its processes (resumes and "
             "the run it extends included; a crashed process's steps after its last checkpoint, "
             "trained again, count once), or for a drafter that does not record it the wall time "
             "of its training processes (loading included); held-out evaluations and any other "
             "load on the machine count. Held-out accuracy: top-1 agreement with the target at each draft "
             "position on conversations no drafter trained on.", ""]
    for t, run in bench.eval.items():
        title = "Greedy (temperature 0)" if float(t) == 0 else f"Sampling (temperature {t})"
        lines += [f"### {title}: means over the prompt sets", "", *_eval_table(bench, t), ""]
        lines += [*lossless_line(run.lossless_check), ""]
    bar_lines, missed = bars(bench)
    lines += ["### Bars (greedy)", "", *bar_lines, ""]
    if missed:
        lines += ["Missed:", "", *[f"- {m}" for m in missed], ""]
    paired = paired_differences(bench)
    lines += [*paired, ""] if paired else []
    order_lines = ordering(bench)
    if order_lines:
        lines += ["### Ordering by tau (greedy)", "", *order_lines, ""]
    lines += titled_passes(bench)
    lines += passes_section(bench, folder)
    lines += engine_section(bench)
    limit_lines = limits(bench, overhead)
    if limit_lines:
        lines += ["### What limits the numbers (from the measurements above)", "", *limit_lines, ""]
    for name in ("scaling", "speedup", "acceptance", "training"):
        if (folder / f"{name}.png").is_file():
            lines.append(f"![{name}]({folder}/{name}.png)")
    return [*lines, ""]


def _measured(run: EvalResults | None) -> str:
    """Where, when and at which commit an evaluation ran: `HARDWARE, DATE, commit C, torch V`."""
    if run is None:
        return "?, ?, commit `?`, torch ?"
    return f"{run.hardware}, {run.date}, commit `{run.commit or '?'}`, torch {run.torch}"


def verify_cost_section(machine_path: Path, heading: str = "Verify cost on this machine"
                        ) -> list[str]:
    """The verify-cost curve of a machine (`draftsmith machine`), when it was measured; `heading`
    may name `{hardware}`."""
    from draftsmith.eval.verify_cost import format_curve

    if not machine_path.is_file():
        return []
    payload = json.loads(machine_path.read_text())
    payload["curves"] = {k: {int(n): v for n, v in c.items()} for k, c in payload["curves"].items()}
    plot = machine_path.with_name("verify_cost.png")
    return [f"## {heading.format(hardware=payload['hardware'])}", "",
            f"{payload['target']} on {payload['hardware']}, {payload['date']}: one target forward "
            f"of n new tokens after {payload['context_len']} cached ones, minimum of "
            f"{payload['repeats']} timings (`draftsmith machine --out {machine_path.parent}`). "
            "Speculation pays only where n tokens cost little more than one. " + (
                "\"few-row\" is the linear form draftsmith adopts where its probe measures it "
                f"faster (per weight shape: {payload['few_row_limits']})."
                if payload["few_row_limits"] else "(The few-row linear form is for float32 CPU "
                "linears; in this dtype torch's own linear runs, minimum over every timing.)"),
            "", format_curve(payload), "",
            *([f"![verify cost]({plot})", ""] if plot.is_file() else [])]


def summary_section(benches: list[BenchResults | dict]) -> list[str]:
    """BENCHMARKS.md's first table: for each target and drafter kind (alone, and with prompt
    lookup as the hybrid), the greedy method with the best speedup across every run, its tau,
    its speedup over prompt lookup's in the same run, the machine and date, and a link to its
    run's section. Speedups are the set means the run tables print. `benches`: BenchResults, or
    bench.json payloads (read through `BenchResults.coerce`)."""
    from draftsmith.registry import DRAFTERS

    best: dict[tuple[str, str], tuple[float, list[str]]] = {}
    for bench in map(BenchResults.coerce, benches):
        cfg, run = bench.config, bench.greedy
        if run is None:
            continue
        summary, names = run.summary, method_names(bench)
        lookup = set_mean(summary, "prompt_lookup", "speedup")
        heading = cfg["target"] + (f" ({bench_name(cfg)})" if bench_name(cfg) != cfg["target"]
                                   else "")
        anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        machine = f"{run.hardware.split(' (')[0].replace('(R)', '')}, " \
                  f"{run.machine.get('dtype') or cfg.get('dtype', '?')}"
        for method in summary.get("all", {}):
            parsed = Method.parse(method)
            record = bench.training.get(parsed.label)
            kind = record.kind if record else None
            speedup = set_mean(summary, method, "speedup")
            if kind not in DRAFTERS or speedup is None:
                continue
            drafter = DRAFTERS[kind].title + (" + prompt lookup" if parsed.with_lookup else "")
            key = (cfg["target"], drafter)
            if key in best and best[key][0] >= speedup:
                continue
            best[key] = (speedup, [
                f"`{cfg['target']}`", drafter, names.get(method, method),
                _fmt(set_mean(summary, method, "tau")), f"**{_fmt(speedup)}x**",
                f"{_fmt(speedup / lookup)}x" if lookup else "–", machine,
                run.date[:10], f"[{heading}](#{anchor})"])
    if not best:
        return []
    return ["## Summary: the best of each kind across runs", "",
            "Greedy, batch 1, each speedup a mean over the prompt sets against plain decoding in "
            "the same run (the run's section has the rest); \"vs prompt lookup\" divides it by "
            "prompt lookup's speedup in that run. Runs differ in machine, budget and data: "
            "compare within a run before across runs.", "",
            "| target | drafter | best method | tau | speedup | vs prompt lookup | machine | "
            "date | run |", "|---|---|---|---|---|---|---|---|---|",
            *["| " + " | ".join(cells) + " |" for _, cells in
              sorted(best.values(), key=lambda row: (row[1][0], -row[0]))], ""]


KEPT_NOTE = ("*Kept from an earlier run* of the benchmark (its machine, date and commit are in "
             "the line above; this run did not measure this target): rerun it with `draftsmith "
             "bench --config {config}`.")


def bench_name(config: dict) -> str:
    """A benchmark's name in BENCHMARKS.md and its one folder under benchmarks/: its config's
    `name` (`smollm2-135m-scaling` names the data-scaling one), else one derived from its target
    that never leads out of benchmarks/: a local folder or a Hub id becomes one path component
    (`/models/llama-8b` -> `models--llama-8b`, `Qwen/Qwen3-8B` -> `Qwen--Qwen3-8B`)."""
    return config.get("name") or target_slug(str(config["target"]))


def target_slug(target: str) -> str:
    """`target` as one safe file name: separators become `--`, anything but letters, digits,
    `.`, `_` and `-` becomes `-`, and no leading dot (so never `.` or `..`)."""
    parts = [p for p in re.split(r"[\\/]+", target) if p not in ("", ".", "..", "~")]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", "--".join(parts)).lstrip(".-")
    return slug or "target"


def earlier_benches(measured: set[str],
                    root: Path = Path("benchmarks")) -> list[tuple[BenchResults, None]]:
    """The committed results (`benchmarks/NAME/bench.json`, read by `read_bench_results`, which
    refuses a damaged one) of benchmarks this run did not measure (`measured`: their names), so
    BENCHMARKS.md keeps every one."""
    kept = []
    for path in sorted(root.glob("*/bench.json")):
        bench = read_bench_results(path)
        name = bench_name(bench.config) if bench.config else None
        if name == path.parent.name and name not in measured:
            kept.append((bench, None))
    return kept


def write_benchmarks(benches: list[tuple[BenchResults | dict, Path | None]], path: Path,
                     overhead_path: Path, preamble: list[str], machine_path: Path | None = None,
                     other_machines: tuple[Path, ...] = ()) -> Path:
    """BENCHMARKS.md from (BenchResults or bench.json payload, its run folder or None for results
    kept from an earlier run) pairs; the verify-cost curve of the machine they ran on heads it,
    and those of `other_machines` (earlier machines' curves, kept for comparison) close it. Each
    measured run's bench.json and raw eval.json files are copied next to its plots (a payload
    that is no bench.json is refused: `BenchResults.coerce`)."""
    benches = [(BenchResults.coerce(bench), run_dir) for bench, run_dir in benches]
    overhead = json.loads(overhead_path.read_text()) if overhead_path.is_file() else None
    lines = ["# Benchmarks", "", "Generated by `scripts/bench.sh` (`draftsmith bench`); do not edit by "
             "hand. tau = tokens per target forward (bonus token included); speedup = tokens/s "
             "against plain decoding through the same loop in the same run; acc@k = acceptance at "
             "draft depth k given depth k-1 was accepted. \"Identical to plain\" is below 100% "
             "in bf16 because near-tied logits can flip between a one-token and a multi-token "
             "forward; in fp32 every method reproduces plain greedy decoding token for token (the "
             "tests check it for every drafter kind and tree shape).", "", *preamble, ""]
    lines += summary_section([bench for bench, _ in benches])
    if machine_path is not None:
        lines += verify_cost_section(machine_path)
    for bench, run_dir in benches:
        folder = Path("benchmarks") / bench_name(bench.config)
        if run_dir is None:  # kept from an earlier run: its files are already in `folder`
            section = target_section(bench, folder, overhead)
            note = KEPT_NOTE.format(config=bench.config.get("path", "its config"))
            lines += [*section[:4], note, "", *section[4:]]  # after the heading and the line
            continue                                       # naming machine, date and commit
        write_plots(bench, folder)
        for old in [*folder.glob("eval_*.json"), *folder.glob("serve_check_*.json")]:
            old.unlink()  # a temperature or pass this run did not measure
        raw = {f"eval_t{t}.json": run_dir / f"eval_t{t}" / "eval.json" for t in bench.eval}
        raw.update({f"eval_{name}.json": run_dir / f"eval_{name}" / "eval.json"
                    for name in bench.passes})
        raw.update({f"serve_check_{drafter}_{engine}.json":
                    engine_folder(run_dir, engine, drafter) / "serve_check.json"
                    for drafter, engine in (name.split(" in ", 1) for name in bench.engines)})
        for name, src in raw.items():
            if src.is_file():
                shutil.copyfile(src, folder / name)
        write_bench_results(folder / "bench.json", bench, indent=1)
        lines += target_section(bench, folder, overhead)
    for other in other_machines:
        lines += verify_cost_section(other, "Verify cost on another machine: {hardware}")
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
