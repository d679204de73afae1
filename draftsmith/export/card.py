"""The model card (README.md) of an export: what the drafter is, how it was trained, how fast it
measured and how to serve it.

Every number comes from a file: training facts from `draftsmith_drafter.json`, results from the
`eval.json` that `draftsmith eval` wrote. Nothing is typed by hand; without an eval.json the card
says "not evaluated".
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from draftsmith.decoding.method import Method
from draftsmith.errors import DraftsmithError
from draftsmith.export.record import ExportFormat
from draftsmith.export.weights import read_json

DRAFTER = "DRAFTER_PATH_OR_REPO"


def read_eval(path: str | Path, meta: dict) -> dict:
    """The results of this very drafter from an eval.json written by `draftsmith eval`.

    The eval may have measured several drafters (`--drafter LABEL=DIR`); the one whose kind,
    target and training steps match the checkpoint's metadata is kept, with its methods renamed
    to their plain names (`drafter_dynamic@eagle1` -> `drafter_dynamic`) next to `plain`.

    Raises:
        DraftsmithError: unreadable file, no drafter results, or results of another drafter
            (kind, target or training steps differ from the checkpoint's metadata).
    """
    payload = read_json(Path(path))
    summary = payload.get("summary")
    measured = payload.get("drafters") or {}
    if not isinstance(summary, dict) or not measured:
        raise DraftsmithError(f"{path} has no drafter results; run `draftsmith eval --drafter CKPT "
                              "--target T` and pass the eval.json it writes")
    mismatch = ""
    matches = []
    for label, entry in measured.items():
        for key, ours in (("kind", meta.get("kind")), ("target", meta.get("target")),
                          ("training_steps", meta.get("training_steps"))):
            theirs = entry.get(key)
            if ours is not None and theirs is not None and theirs != ours:
                mismatch = (f"{path} measured a drafter with {key}={theirs!r} but this "
                            f"checkpoint has {key}={ours!r}; evaluate this checkpoint first")
                break
        else:
            matches.append(label)
    if not matches:
        raise DraftsmithError(mismatch)
    if len(matches) > 1:
        raise DraftsmithError(f"{path} measured several drafters that fit this checkpoint "
                              f"({', '.join(matches)}); evaluate this checkpoint on its own")
    label = matches[0]
    # the drafter's own trees only: the prompt-lookup hybrid is draftsmith's loop, not an engine's
    kept = {set_name: {method.base: row for name, row in rows.items()
                       for method in [Method.parse(name)]
                       if method.base == "plain" or (method.uses_drafter and not method.with_lookup
                                                     and method.label == label)}
            for set_name, rows in summary.items()}
    if not any(Method.parse(m).uses_drafter for rows in kept.values() for m in rows):
        raise DraftsmithError(f"{path} has no `drafter*` method in its summary")
    return {**payload, "summary": kept, "drafter": measured[matches[0]]}


def _number(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _title(kind: str) -> str:
    from draftsmith.registry import DRAFTERS

    return DRAFTERS[kind].title if kind in DRAFTERS else kind


def _eval_section(payload: dict | None) -> list[str]:
    if payload is None:
        return ["Not evaluated: this export was made without `--eval-json`. Measure it with",
                "`draftsmith eval --drafter CKPT --target T` and export again with",
                "`--eval-json RUN/eval.json`.", ""]
    config = payload.get("config") or {}
    sampling = config.get("sampling") or {}
    lines = ["| set | method | tau | speedup | tokens/s | acceptance by depth | identical to plain |",
             "|---|---|---|---|---|---|---|"]
    for set_name, rows in payload["summary"].items():
        for method, row in rows.items():
            if method != "plain" and not Method.parse(method).uses_drafter:
                continue
            depth = ", ".join(_number(a) for a in (row.get("acceptance_by_depth") or [])[:6])
            identical = row.get("identical_to_plain")
            lines.append(
                f"| {set_name} | {method} | {_number(row.get('tau'))} | "
                f"{_number(row.get('speedup'))}x | {_number(row.get('tokens_per_second'), 1)} | "
                f"{depth or 'n/a'} | {'n/a' if identical is None else f'{identical:.0%}'} |")
    lines += [
        "",
        f"Measured by `draftsmith eval` on {payload.get('hardware', 'unknown hardware')}, "
        f"{payload.get('date', 'unknown date')}, commit `{payload.get('commit', '?')}`: "
        f"dtype {(payload.get('machine') or {}).get('dtype') or config.get('dtype', '?')}, temperature {sampling.get('temperature', '?')}, "
        f"{config.get('limit', '?')} prompt(s) per set, {config.get('max_new_tokens', '?')} new "
        "tokens. tau = tokens per target forward including the bonus token; speedup = tokens/s "
        "against plain decoding in the same run. Copied from eval.json.",
        ""]
    return lines


def _serving(fmt: ExportFormat, base: str, settings: dict) -> list[str]:
    """The card's serving section: the format's engine sections, then draftsmith's own loop."""
    lines = ["## Serving", ""]
    if fmt.is_folder:
        lines += [f"Replace `{DRAFTER}` with this folder or its Hub repo id.", ""]
    for section in fmt.serving(base, DRAFTER, settings):
        lines += [f"### {section.engine}", ""]
        if section.command:
            lines += ["```bash", *section.command, "```", ""]
        if section.note:
            lines += [section.note, ""]
    if fmt.is_folder:
        lines += ["### draftsmith", "", "```bash",
                  f"draftsmith eval --drafter {DRAFTER} --target {base}", "```", ""]
    from draftsmith.export.engine_support import format_support

    lines += ["### Engines and versions", "",
              f"How far draftsmith has checked the `{fmt.name}` layout in each engine (proved: "
              "served next to draftsmith's own loop, the same output and acceptance per draft "
              "position within 2 points; benchmarks/engine-proof/ in draftsmith's repository):",
              "", *format_support(fmt, settings), ""]
    return lines


def _data_line(data: dict) -> str:
    if not data:
        return "not recorded"
    parts = [f"{k} {v}" for k, v in data.items()
             if not isinstance(v, dict) and k not in ("out_dir", "regenerate")]
    regen = data.get("regenerate")
    if isinstance(regen, dict):
        which = (f"the first {regen['limit']} conversations' responses regenerated by the target, "
                 "the rest as written" if regen.get("limit") else "responses regenerated by the target")
        parts.append(which + " (" + ", ".join(
            f"{k} {v}" for k, v in regen.items() if k != "limit") + ")")
    elif "regenerate" in data:
        parts.append("responses as written (the labels are the target's logits)")
    return "; ".join(parts)


def _recipe_line(recipe: dict) -> str:
    train = recipe.get("train") or {}
    keys = ("lr", "batch_size", "grad_accum", "max_steps", "warmup_steps", "max_length",
            "features")
    return ", ".join(f"{k} {train[k]}" for k in keys if k in train) or "not recorded"


def model_card(meta: dict, fmt: ExportFormat, base_model: str | None, files: dict[str, int],
               eval_payload: dict | None) -> str:
    """README.md text with Hub YAML front matter.

    Args:
        meta: the checkpoint's `draftsmith_drafter.json`.
        fmt: the export format written.
        base_model: Hub id of the target (None when it has none, e.g. a local folder).
        files: exported file name -> size in bytes.
        eval_payload: from `read_eval`, or None ("not evaluated").
    """
    kind = meta["kind"]
    target = base_model or meta.get("target") or "the target"
    front = {"library_name": fmt.library_name,
             **({"base_model": base_model} if base_model else {}),
             "tags": list(dict.fromkeys(["speculative-decoding", "draftsmith", kind, fmt.name]))}
    recipe = meta.get("recipe") or {}
    settings = meta.get("drafter_config") or {}
    facts = [("Target", f"`{target}`"), ("Drafter kind", f"{kind} ({_title(kind)})"),
             ("Export format", f"{fmt.name}: {fmt.description}"),
             ("Training steps", f"{meta.get('training_steps', 'not recorded')} "
                                f"({meta.get('num_processes', '?')} process(es))"),
             ("Data", _data_line(recipe.get("data") or {})),
             ("Recipe", _recipe_line(recipe))]
    if meta.get("aux_layers"):
        facts.append(("Aux layers", f"{meta['aux_layers']} (0-based target layer outputs)"))
    if "draft_vocab_size" in settings:
        facts.append(("Draft vocab", f"{settings['draft_vocab_size']} of "
                                     f"{meta['target_config'].get('vocab_size', '?')} tokens"))
    if meta.get("lora"):
        facts.append(("Medusa-2", "the target was fine-tuned jointly through LoRA; the adapter is "
                                  "in `lora/` and must be merged into the target to serve"))
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "",
             f"# {_title(kind)} drafter for {target}", "",
             f"A speculative-decoding drafter trained with draftsmith against the frozen target "
             f"`{target}`.", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in facts], "",
             "## Evaluation", "", *_eval_section(eval_payload), *_serving(fmt, target, settings),
             "## Files", "", *[f"- `{name}` ({size:,} bytes)" for name, size in files.items()], ""]
    if recipe:
        lines += ["## Training recipe", "", "```yaml", yaml.safe_dump(recipe, sort_keys=False).strip(),
                  "```", ""]
    return "\n".join(lines)
