"""The benchmark's stages for one target, each resumable: shared data -> per-drafter calibration
and training under the same wall-clock budget -> one evaluation run per temperature and the extra
passes -> the engine checks (`engine`: the drafters served by real engines) -> results.

Layout under `out_dir`:
    data/                      the shared data preparation (data pipeline output)
    recipes/LABEL.yaml         the exact recipe each drafter trained with
    calibrate/LABEL/           the short run that estimated seconds per step
    train/LABEL/               checkpoints, metrics.jsonl, drafter/ (final), budget.json
    eval_t{T}/eval.json        every method side by side at temperature T (+ plots)
    eval_{pass}/eval.json      the extra greedy runs (batch sizes, quantized target)
    engine/LABEL/ENGINE/serve_check.json   a drafter served by llama.cpp (or vLLM) next to
                               draftsmith's loop (`engine` stage, bench/engine_stage.py)
    bench.json                 everything the report needs
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from draftsmith.bench.config import BenchConfig, KindEntry
from draftsmith.bench.engine_stage import engine_check, read_engine_checks
from draftsmith.bench.extend import extension_recipe, seed_extension
from draftsmith.bench.report_stats import per_prompt_timings
from draftsmith.bench.train_pace import (
    run_seconds_per_step,
    seconds_per_step,
    tokens_per_second,
)
from draftsmith.bench.train_process import run_training_process
from draftsmith.errors import DraftsmithError
from draftsmith.eval.methods import Method
from draftsmith.eval.results import (
    BenchResults,
    EvalResults,
    TrainingRecord,
    read_eval_results,
    read_training_record,
    write_bench_results,
    write_training_record,
)
from draftsmith.files import write_json
from draftsmith.train.budget import steps_for_budget
from draftsmith.train.metrics import metrics_rows
from draftsmith.train.recipe import TrainSection


def data_folder(config: BenchConfig, entry: KindEntry | None = None) -> Path:
    """Where a drafter's data is prepared: the shared `data/`, or `data-<recipe file name>` for an
    entry with a data recipe of its own."""
    if entry is None or not entry.data:
        return Path(config.out_dir) / "data"
    return Path(config.out_dir) / f"data-{Path(entry.data).stem}"


def prepare_data(config: BenchConfig, log=print, entry: KindEntry | None = None) -> Path:
    """Run the shared data recipe, or an entry's own (resumes; finished steps are skipped)."""
    from draftsmith.data.config import load_data_recipe
    from draftsmith.data.pipeline import run_data_recipe

    folder = data_folder(config, entry)
    source = entry.data if entry is not None and entry.data else config.data
    recipe = load_data_recipe(source, [f"data.out_dir={folder}",
                                       f"target.device={config.compute_device()}"])
    summary = run_data_recipe(recipe, log=log)
    if not (folder / "tokenized.jsonl").is_file() or \
            (summary.get("cache") and not summary["cache"]["complete"]):
        raise DraftsmithError(f"the data preparation in {folder} did not finish; run the "
                              "benchmark again to resume it")
    return folder


def kind_recipe(config: BenchConfig, entry: KindEntry, **train) -> dict:
    """The kind's recipe with the shared data section and the benchmark's overrides."""
    from draftsmith.config_values import read_yaml_mapping

    raw = read_yaml_mapping(entry.recipe, "recipe", "recipes live in recipes/")
    source = entry.data or config.data
    data = read_yaml_mapping(source, "data recipe", "see recipes/data/")
    if not isinstance(data.get("data"), dict):
        raise DraftsmithError(f"data recipe {source} has no `data:` section")
    data = data["data"]
    data["out_dir"] = str(data_folder(config, entry))
    raw["data"] = data
    target = config.target_spec()
    raw["target"] = {**raw.get("target", {}), "name": target.name, "dtype": target.dtype}
    raw["drafter"] = {**raw.get("drafter", {}), **entry.drafter}
    raw["train"] = {**raw.get("train", {}), **config.train, **entry.train, **train}
    return raw


def _metrics(folder: Path) -> list[dict]:
    """A training run's metrics rows (none before it started; a torn last line dropped)."""
    path = folder / "metrics.jsonl"
    return [row for _, row in metrics_rows(path)] if path.is_file() else []


CEILING_FACTOR = 4  # a run may take at most this many times the calibration's step estimate


def mean_step_tokens(folder: Path, train: dict) -> float | None:
    """Real tokens in an average optimizer step of `batching: rows` on a data folder (its
    summary.json: rendered tokens per conversation x conversations per step), or None without a
    summary or with token batches, whose steps all hold about `batch_tokens` padded tokens (a
    calibration's steps are then already the run's average, and a conversation count says
    nothing of how many a step takes)."""
    data = _data_record(folder)
    if train.get("batching", TrainSection.batching) != "rows" or not data.get("tokens") or \
            not data.get("conversations"):
        return None
    samples = train["batch_size"] * train.get("grad_accum", 1)
    return data["tokens"] / data["conversations"] * samples


def trainable_params(drafter_dir: Path, kind: str) -> int:
    """Parameters a drafter trains: its saved tensors minus the frozen copies of the target's
    embedding / head, plus a Medusa-2 LoRA adapter."""
    from safetensors import safe_open

    from draftsmith.registry import get_spec

    total = 0
    files = [(drafter_dir / "model.safetensors", get_spec(kind).frozen_prefixes),
             (drafter_dir / "lora" / "adapter_model.safetensors", ())]
    for path, frozen in files:
        if path.is_file():
            with safe_open(str(path), "pt") as handle:
                names = list(handle.keys())
                slices = [handle.get_slice(k) for k in names if not k.startswith(frozen)]
                total += sum(math.prod(t.get_shape()) for t in slices
                             if t.get_dtype() not in ("I64", "BOOL"))  # d2t / t2d are buffers
    return total


def read_record(folder: Path) -> TrainingRecord:
    """A finished drafter's budget record (older records get their parameter count here)."""
    record = read_training_record(folder / "budget.json")
    if record.trainable_params is None:
        record.trainable_params = trainable_params(folder / "drafter", record.kind)
    return record


def train_kind(config: BenchConfig, entry: KindEntry, log=print) -> TrainingRecord:
    """Calibrate, then train one drafter for the budget; returns its budget record."""
    out = Path(config.out_dir)
    folder = out / "train" / entry.label
    record_path = folder / "budget.json"
    if record_path.is_file() and (folder / "drafter").is_dir():
        return read_record(folder)
    if entry.extends:  # the run of another drafter, trained on (bench/extend.py)
        base = train_kind(config, config.kind(entry.extends), log)
        budget = entry.budget_minutes or config.budget_minutes
        raw = extension_recipe(base, folder, budget, CEILING_FACTOR)
        seed_extension(base, out / "train" / entry.extends, folder, raw, entry.label, log)
        return _train_and_record(config, entry, raw, base.calibrated_seconds_per_step, budget,
                                 log)
    if entry.data:  # its own data (resumes; the shared one is the data stage's)
        prepare_data(config, log, entry)
    calibration = out / "calibrate" / entry.label
    rows = _metrics(calibration)
    if not any(r.get("step") == config.calibration_steps and "loss" in r for r in rows):
        raw = kind_recipe(config, entry, max_steps=config.calibration_steps, warmup_steps=1,
                          eval_every=0, save_every=0, eval_fraction=0.0, output_dir=str(calibration))
        run_training_process(config, raw, out / "recipes" / f"{entry.label}-calibrate.yaml", log)
        rows = _metrics(calibration)
    raw = kind_recipe(config, entry, output_dir=str(folder))
    per_step = seconds_per_step(rows, mean_step_tokens(data_folder(config, entry), raw["train"]))
    budget = entry.budget_minutes or config.budget_minutes
    steps = max(config.calibration_steps, steps_for_budget(
        per_step, budget * 60, elapsed_seconds=0.0, done_steps=0, max_steps=sys.maxsize))
    log(f"{entry.label}: {per_step:.2f} s/step (for the data's mean batch) -> about {steps} steps "
        f"in {budget:g} min; train.max_minutes={budget:g} sets the total from the run's own pace")
    # The run's own planner (train.max_minutes) sizes it: a calibration's few steps misjudge the
    # pace (DFlash: 0.45 s/step calibrated, 0.26 s/step run, so its fixed steps took 4.1 of 7
    # minutes while EAGLE-3's took 6.1). The estimate only sets the warmup, the checkpoint and
    # evaluation cadence (one held-out evaluation about halfway) and a ceiling.
    raw["train"].update(max_minutes=budget, max_steps=CEILING_FACTOR * steps,
                        warmup_steps=min(raw["train"].get("warmup_steps", 0), steps // 10),
                        save_every=max(steps // 4, 1), eval_every=max((steps + 1) // 2, 1))
    return _train_and_record(config, entry, raw, per_step, budget, log)


def _train_and_record(config: BenchConfig, entry: KindEntry, raw: dict, per_step: float,
                      budget: float, log) -> TrainingRecord:
    """Train one drafter with its recipe (resuming what is there); returns its budget record."""
    out = Path(config.out_dir)
    folder = out / "train" / entry.label
    record_path, attempts_path = folder / "budget.json", folder / "attempts.json"
    attempts = json.loads(attempts_path.read_text()) if attempts_path.is_file() else []
    folder.mkdir(parents=True, exist_ok=True)
    finished = (folder / "drafter" / "draftsmith_drafter.json").is_file()
    start = time.perf_counter()
    try:
        run_training_process(config, raw, out / "recipes" / f"{entry.label}.yaml", log)
    finally:  # a stopped or failed attempt took its minutes too
        if not finished:  # a drafter trained before (its record not yet written) cost nothing now
            attempts.append(time.perf_counter() - start)
        write_json(attempts_path, attempts)
    rows = _metrics(folder)
    trained = [r for r in rows if "loss" in r]
    steps = trained[-1]["step"] if trained else 0
    final = [r for r in rows if r.get("step") == steps and any(k.startswith("eval/") for k in r)]
    record = TrainingRecord(
        label=entry.label, kind=raw["drafter"]["kind"], steps=steps,
        seconds_per_step=run_seconds_per_step(rows) or per_step,
        calibrated_seconds_per_step=per_step, budget_minutes=budget,
        data=_data_record(data_folder(config, entry)),
        tokens_per_second=tokens_per_second(rows),
        tokens_seen=sum(r.get("tokens", 0) for r in rows if "loss" in r),
        max_length=raw["train"].get("max_length"),
        train_minutes=_train_seconds(folder, attempts) / 60, batch_size=raw["train"]["batch_size"],
        features=raw["train"].get("features", "online"),
        lora=bool(raw["drafter"].get("lora")),
        shared_head=bool(raw["drafter"].get("shared_head")),
        trainable_params=trainable_params(folder / "drafter", raw["drafter"]["kind"]),
        held_out={k[5:]: v for k, v in (final[-1] if final else {}).items()
                  if k.startswith("eval/")},
        recipe=str(out / "recipes" / f"{entry.label}.yaml"),
    )
    if (folder / "extends.json").is_file():
        record.extends = json.loads((folder / "extends.json").read_text())
    write_training_record(record_path, record)
    return record


def _train_seconds(folder: Path, attempts: list[float]) -> float:
    """A drafter's training seconds: its run's own budget clock (every process, stopped ones and
    the run it extends included; a crashed process's steps after its last checkpoint count once,
    as trained again) where the drafter records it, else the training processes' wall seconds
    this benchmark timed."""
    meta = json.loads((folder / "drafter" / "draftsmith_drafter.json").read_text())
    return meta.get("train_seconds") or sum(attempts)


def _data_record(folder: Path) -> dict:
    """What a drafter trained on: its data folder's conversations and tokens (summary.json)."""
    path = folder / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    rendering = summary.get("rendering") or {}
    return {"folder": str(folder), "conversations": rendering.get("rendered"),
            "tokens": rendering.get("tokens"),
            "regenerated": (summary.get("regeneration") or {}).get("conversations"),
            "cached": (summary.get("cache") or {}).get("samples")}


def evaluate(config: BenchConfig, temperature: float, log=print) -> EvalResults:
    """All methods side by side at one temperature (skipped when its eval.json exists)."""
    ev = config.eval
    return run_eval_stage(config, Path(config.out_dir) / f"eval_t{temperature:g}",
                          tuple(ev.methods), log, temperature=temperature,
                          check_lossless=ev.check_lossless and temperature == 0)


def evaluate_pass(config: BenchConfig, name: str, log=print) -> EvalResults:
    """One of `eval.passes` (greedy), e.g. the batch-size curve, the quantized target or other
    prompt sets (`bench`: the long documents of `sharegpt_long`)."""
    spec = config.eval.passes[name]
    extra = {k: tuple(spec[k]) for k in ("batch_sizes", "target_quant", "bench") if k in spec}
    extra.update({k: spec[k] for k in ("limit", "max_new_tokens") if k in spec})
    if "autotune_tree" in spec:
        extra["autotune_tree"] = spec["autotune_tree"]
    if spec.get("check_lossless"):  # a gate, not a timing: trees as configured, not autotuned
        extra.update(check_lossless=True, autotune_tree=False)
    return run_eval_stage(config, Path(config.out_dir) / f"eval_{name}", tuple(spec["methods"]),
                          log, temperature=0.0, **extra)


def run_eval_stage(config: BenchConfig, out: Path, methods: tuple[str, ...], log, *,
                   temperature: float, **fields) -> EvalResults:
    """One evaluation run into `out` (skipped when its eval.json holds these methods; run again
    when the config's methods changed since); `fields` override the eval section's settings
    (limit, max_new_tokens, autotune_tree, ...)."""
    from draftsmith.eval.config import build_eval_config
    from draftsmith.eval.evaluate import run_eval

    path = out / "eval.json"
    if path.is_file():
        done = read_eval_results(path)
        then = done.config.get("methods")
        if then is None or list(then) == ["plain", *methods]:
            return done
        log(f"{path} evaluated {', '.join(then)}; the config now asks for "
            f"{', '.join(['plain', *methods])}: evaluating them all again, side by side")
    ev = config.eval
    drafters = tuple((k.label, str(Path(config.out_dir) / "train" / k.label / "drafter"))
                     for k in config.kinds)
    used = {Method.parse(m).label for m in methods}
    datastore = Path(config.out_dir) / "data" / "datastore"
    target = config.target_spec()
    settings = {"limit": ev.limit, "max_new_tokens": ev.max_new_tokens,
                "autotune_tree": ev.autotune_tree, "bench": tuple(ev.bench), **fields}
    # int8 target variants are CPU kernels: a pass that compares them runs on the CPU
    quantized = len(settings.get("target_quant", ("none",))) > 1
    settings["device"] = "cpu" if quantized else config.compute_device()
    eval_config = build_eval_config(
        settings=replace(ev.decode, datastore=str(datastore) if ev.datastore else None),
        temperature=temperature, target=target.name, draft_model=ev.draft_model,
        drafters=tuple(d for d in drafters if d[0] in used), dtype=target.dtype,
        methods=("plain", *methods), out_dir=str(out), **settings)
    run_eval(eval_config, log=log)
    return read_eval_results(path)


def check_eval_prompts_early(config: BenchConfig) -> None:
    """Before data and training: every evaluation's prompts fit the target's context, rendered
    with the tokenizer's chat template (`run_eval_stage` checks again with the drafters' template).

    Raises:
        DraftsmithError: see `draftsmith.eval.prompts_fit.check_prompts_fit`.
    """
    from draftsmith.eval.prompts.files import gather_prompts
    from draftsmith.eval.prompts_fit import check_prompts_fit, draft_margin, target_context_length
    from draftsmith.target.load import load_tokenizer

    ev = config.eval
    target = config.target_spec()
    context = target_context_length(target.name, target.trust_remote_code)
    if not context:
        return
    runs = [("eval", tuple(ev.bench), ev.limit, ev.max_new_tokens)] + [
        (f"eval.passes.{name}", tuple(spec.get("bench", ev.bench)), spec.get("limit", ev.limit),
         spec.get("max_new_tokens", ev.max_new_tokens)) for name, spec in ev.passes.items()]
    tokenizer = load_tokenizer(target.name, trust_remote_code=target.trust_remote_code)
    for where, sets, limit, max_new_tokens in runs:
        check_prompts_fit(tokenizer, gather_prompts(sets, (), limit), context,
                          max_new_tokens, draft_margin(ev.decode, ev.autotune_tree),
                          setting=f"{where}.max_new_tokens")


def run_bench(config: BenchConfig,
              stages: tuple[str, ...] = ("data", "train", "eval", "engine"),
              log=print) -> Path:
    """Run the asked stages (each resumes), then write bench.json; returns its path."""
    out = Path(config.out_dir)
    if "eval" in stages:
        check_eval_prompts_early(config)
    if "data" in stages:
        prepare_data(config, log)
    records = {}
    for entry in config.kinds:
        if "train" in stages:
            records[entry.label] = train_kind(config, entry, log)
        elif (out / "train" / entry.label / "budget.json").is_file():
            records[entry.label] = read_record(out / "train" / entry.label)
    evals = {}
    for temperature in config.eval.temperatures:
        if "eval" in stages:
            evals[f"{temperature:g}"] = evaluate(config, temperature, log)
        elif (out / f"eval_t{temperature:g}" / "eval.json").is_file():
            evals[f"{temperature:g}"] = read_eval_results(
                out / f"eval_t{temperature:g}" / "eval.json")
    passes = {}
    for name in config.eval.passes:
        if "eval" in stages:
            passes[name] = evaluate_pass(config, name, log)
        elif (out / f"eval_{name}" / "eval.json").is_file():
            passes[name] = read_eval_results(out / f"eval_{name}" / "eval.json")
    engines = engine_check(config, log) if "engine" in stages else read_engine_checks(config)
    data_summary = out / "data" / "summary.json"
    results = BenchResults(
        config={**asdict(replace(config, kinds=[])), "kinds": [asdict(k) for k in config.kinds],
                "eval": config.eval.record()},
        data=json.loads(data_summary.read_text()) if data_summary.is_file() else None,
        training=records,
        curves={label: [r for r in _metrics(out / "train" / label)
                        if any(k.startswith("eval/") for k in r)] for label in records},
        # bench.json keeps each run's summaries, not its per-turn records (eval.json has them)
        eval={t: replace(e, records=[], per_prompt=per_prompt_timings(e.records))
              for t, e in evals.items()},
        passes={n: replace(e, records=[], batch_records=[]) for n, e in passes.items()},
        engines={name: {k: v for k, v in check.items() if k != "records"}
                 for name, check in engines.items()},
    )
    path = write_bench_results(out / "bench.json", results)
    log(f"benchmark results: {path}")
    return path
