"""Sections of BENCHMARKS.md beside the main tables: the lossless check's sentence, how the data
was regenerated, and the extra greedy runs (`eval.passes`: the batch-size curve, the
quantized-target rows)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from draftsmith.eval.results import BenchResults
from draftsmith.registry import get_spec
from draftsmith.serving.serve_check import near_tie_note


def fmt(value, spec: str = ".2f", none: str = "–") -> str:
    """`value` formatted, or `none` for a missing or NaN value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return none
    return format(value, spec)


def lossless_line(check: dict | None) -> list[str]:
    """The eval run's lossless check (eval.json `lossless_check`) in one sentence."""
    if not check or not check.get("greedy"):
        return []
    if check.get("failures"):
        return ["Lossless check: " + "; ".join(
            f"{f['method']} left plain decoding on {f['set']}/{f['item']} at new token "
            f"{f['index']}" for f in check["failures"])
            + (" (float32: a bug)" if check.get("dtype_exact") else
               " (bf16: near-tied logits can flip between one- and multi-token forwards)") + "."]
    return [f"Lossless check: {len(check.get('checked', []))} methods reproduced plain greedy "
            "decoding token for token" + (" in float32." if check.get("dtype_exact") else ".")]


def variant_divergence(check: dict) -> list[str]:
    """How far speculation over each quantized copy followed that copy's own plain decoding."""
    failures = [f for f in check.get("failures") or [] if f["method"].endswith(" target)")]
    checked = [m for m in check.get("checked") or [] if m.endswith(" target)")]
    if not checked:
        return []
    if not failures:
        return [f"All {len(checked)} methods over the quantized copies reproduced that copy's own "
                "plain greedy decoding token for token."]
    why = []
    if any(f["method"].endswith("(int8 target)") for f in failures):
        why.append("Dynamic int8 quantizes each forward's activations with one scale over all of "
                   "its rows, so an n-token verify differs from one-token decoding: its rows are "
                   "the int8 model's outputs up to that effect")
    if not check.get("dtype_exact") and any(not f["method"].endswith("(int8 target)")
                                            for f in failures):
        why.append("In bf16 near-tied logits flip between one- and multi-token forwards in "
                   "attention and norms, as over the bf16 target (weight-only int8 computes "
                   "each row on its own; the float32 gate checks it token for token)")
    return ["Not bit-identical to the quantized copy's own plain decoding: " + "; ".join(
        f"{f['method']} first left it on {f['set']}/{f['item']} at new token {f['index']}"
        for f in failures) + (". " + ". ".join(why) + "." if why else " (float32: a bug).")]


def regenerated_line(data: dict) -> str:
    """How the answers were made, from the data step's summary."""
    regen = data.get("regeneration") or {}
    server = regen.get("server") or {}
    rate = (regen.get("new_tokens") or {}).get("tokens_per_second")
    how = (f"through {server.get('engine', 'a server')} serving {server.get('model')} (greedy "
           f"agreement with the target {fmt(server.get('greedy_agreement'), '.0%')})"
           if server else "in process")
    return (f"answered again by the target {how} at {fmt(rate, '.1f')} new tokens/s "
            f"({fmt(regen.get('conversations'), ',')} regenerated, "
            f"{len(regen.get('failed') or [])} failed, {fmt(regen.get('skipped'), ',')} skipped)")


def passes_section(bench: BenchResults, folder: Path) -> list[str]:
    """The extra greedy runs: the batch-size curve (table and plot) and the quantized-target
    rows, each measured in one run on the same prompts as the main table."""
    from draftsmith.eval.report import format_batch_table, format_variant_table, write_batch_plot

    lines = []
    for name, result in bench.passes.items():
        cfg = result.config
        size = (f"{cfg.get('limit')} prompt(s) per set, {cfg.get('max_new_tokens')} new tokens "
                "per turn")
        if result.batch_sizes:
            plot = write_batch_plot(result.batch_sizes, folder)
            skipped = result.batch_skipped
            lines += [f"### Batch sizes (`{name}` run, greedy, {size}): speedup over plain "
                      "decoding at the same batch size", "", "```", format_batch_table(result.batch_sizes),
                      "```", "", *([f"Skipped above batch 1: {', '.join(skipped)}.", ""]
                                   if skipped else []),
                      *lossless_line(result.lossless_check), "", f"![batch]({plot})", ""]
        check = result.lossless_check
        if check and cfg.get("check_lossless") and not result.batch_sizes:
            sets = [s for s in result.summary if s != "all"]
            lines += [f"### Lossless gate (`{name}` run, greedy, float32): {cfg.get('limit')} "
                      f"prompt(s) per set of {', '.join(sets)} (MT-bench: both turns), "
                      f"{cfg.get('max_new_tokens')} new tokens per turn", "",
                      *lossless_line(check), ""]
        if len(result.target_variants) > 1:  # a quantized copy beside `none`
            dtype = result.machine.get("dtype")
            lines += [f"### Quantized target (`{name}` run, greedy, {size}"
                      + (f", base {dtype}" if dtype else "") + "): the same drafters verified by a "
                      "quantized copy of the target", "", "```",
                      format_variant_table(result.target_variants), "```", "",
                      *variant_divergence(check), ""]
    return lines


def engine_section(bench: BenchResults) -> list[str]:
    """The engine checks: each exported drafter in each serving engine next to draftsmith's loop
    (same prompts, same drafter, same chain length), from each `serve_check.json`, with the
    engine's speed per draft GGUF type where several ran."""
    lines = []
    for name, check in bench.engines.items():
        lines += _engine_table(name, check)
    return lines


def _engine_table(name: str, check: dict) -> list[str]:
    engine, loop = check["engine_stats"], check.get("draftsmith") or {}
    same, total = check["identical"]
    rows = [("tau (tokens per target step)", fmt(engine["tau"]), fmt(loop.get("tau"))),
            ("acceptance rate", fmt(engine["acceptance"], ".1%"), fmt(loop.get("acceptance"), ".1%"))]
    for k, rate in enumerate(engine["acceptance_per_position"]):
        theirs = (loop.get("acceptance_per_position") or [])[k:k + 1]
        rows.append((f"accepted at draft position {k + 1}", fmt(rate, ".1%"),
                     fmt(theirs[0] if theirs else None, ".1%")))
    rows += [("tokens/s with the draft", fmt(engine["tokens_per_second_spec"], ".1f"),
              fmt(loop.get("tokens_per_second"), ".1f")),
             ("tokens/s plain (engine)", fmt(engine["tokens_per_second_plain"], ".1f"), ""),
             ("speedup over the engine's plain decoding", fmt(engine["speedup"]) + "x", "")]
    table = [f"{'':44} {name.split(' in ')[-1]:>10} {'draftsmith loop':>16}",
             *[f"{row:44} {a:>10} {b:>16}" for row, a, b in rows]]
    answers = loop.get("same_answer_as_engine")
    if check.get("target_gguf") and check.get("target_outtype"):
        served = (f"converted by llama.cpp's own converter and served with `--spec-type "
                  f"{check['spec_type']}` on the target's folder converted by the same converter "
                  f"to GGUF in {check['target_outtype']} (the weights the loop decodes)")
        precision = "both compute the same weights; near-ties may still flip between kernels"
        timing = "the engine's own decode timings"
    elif check.get("target_gguf"):
        served = (f"converted by llama.cpp's own converter and served with `--spec-type "
                  f"{check['spec_type']}` on the target's GGUF ({Path(check['target_gguf']).name}, "
                  "which the engine computes in its quantized form)")
        precision = "the engine computes with quantized weights, the loop in float32"
        timing = "the engine's own decode timings"
    else:
        shown = {k: v for k, v in check["speculative_config"].items() if k != "model"}
        served = (f"served as written with `--speculative-config {json.dumps(shown)}` (plus the "
                  f"export's folder as `model`) on the target's folder in "
                  f"{check.get('dtype', 'float32')}")
        precision = "both compute in float32; near-ties may still flip between kernels"
        timing = "each request's wall time (prefill included)"
    title = get_spec(check.get("kind", "eagle3")).title
    form = check.get("export_format", "eagle3")
    return [f"### In a serving engine: {check['engine']} {check['version']} (greedy, {title} chain "
            f"of {check['draft_max']})", "",
            f"The trained {title} drafter exported (`{form}`), {served}, {check['prompts']} "
            f"prompts (first turns of {', '.join(check['prompt_sets'])}) x "
            f"{check['max_new_tokens']} new tokens, engine threads: "
            f"{check.get('engine_threads') or 'all'}; tokens/s from {timing}; draftsmith's loop "
            "decodes the same prompts in float32 with the same drafter and chain length.", "",
            "```", *table, "```", "",
            f"Engine output with the draft identical to its plain decoding: {same}/{total}"
            + near_tie_note(check.get("records", []))
            + (f"; the loop's answers equal to the engine's: {answers[0]}/{answers[1]} "
               f"({precision})" if answers else "")
            + f". Check {'passed' if check.get('passed') else 'FAILED'}.", "",
            *_draft_types(check)]


def _draft_types(check: dict) -> list[str]:
    """The engine's speed with the draft GGUF in each weight type (llama.cpp, several asked)."""
    types = check.get("draft_types") or {}
    if not types:
        return []
    lines = ["| draft GGUF type | size | tau | acceptance | tokens/s | speedup over the engine's "
             "plain decoding | identical to plain |", "|---|---|---|---|---|---|---|"]
    for outtype, run in types.items():
        lines.append(f"| {outtype} | {run['draft_gguf_bytes'] / 1e6:.1f} MB | {fmt(run['tau'])} | "
                     f"{fmt(run['acceptance'], '.1%')} | {fmt(run['tokens_per_second_spec'], '.1f')} "
                     f"| **{fmt(run['speedup'])}x** | {run['identical'][0]}/{run['identical'][1]} |")
    plain = next(iter(types.values()))["tokens_per_second_plain"]
    return [f"Draft weights in smaller types (the converter's `--outtype`; one plain run at "
            f"{fmt(plain, '.1f')} tokens/s for all): the draft's weights cost the engine memory "
            "bandwidth per step like the target's.", "", *lines, ""]
