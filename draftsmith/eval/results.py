"""The results files as types, each with a schema version and one reader: `eval.json`
(`EvalResults`, written by `draftsmith eval`) and `bench.json` (`BenchResults`, written by
`draftsmith bench`; its evaluation runs are `EvalResults` without their per-turn records, its
drafters' trainings `TrainingRecord`s, each also its run folder's `train/LABEL/budget.json`).

The benchmark, its report and its plots read results only through `read_eval_results` /
`read_bench_results`. A file written before the schema had a version is read when its fields
are this schema's; a damaged, foreign or newer file is refused with one message that names the
file, what is wrong and the command that writes it again.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.files import write_json

EVAL_SCHEMA = 1  # eval.json's schema_version (files from before it have none)
BENCH_SCHEMA = 1  # bench.json's
EVAL_FIX = "re-run the `draftsmith eval` command (or the benchmark's eval stage) that writes it"
BENCH_FIX = ("re-run `draftsmith bench --config CONFIG` (`--stages none` writes it again from the "
             "run folder's results)")
# left out of the file when empty: a run without a batch-size curve, bench.json's runs (records
# dropped, per_prompt added), eval.json's (no per_prompt)
OMITTED_WHEN_EMPTY = ("records", "batch_sizes", "batch_skipped", "batch_records", "per_prompt")

# prompt set, and "all" over every set -> method name -> metrics (`eval.metrics.summarize`, plus
# `speedup` against plain decoding and `identical_to_plain`)
Summary = dict[str, dict[str, dict]]


@dataclass
class EvalResults:
    """What one `draftsmith eval` run measured (eval.json).

    Attributes:
        config: the run's `EvalConfig` as written (`dataclasses.asdict`).
        summary: see `Summary`.
        hardware: the machine in words; `machine`: its record (`hardware_record`).
        date, commit, torch: when, at which commit and with which torch it ran.
        tree_budgets: per autotuned method, the tree picked (depth, total_tokens, ...).
        drafters: per drafter label, its kind, path, training steps, LoRA and target.
        target_variants: per copy of the target (`--target-quant`), its summary.
        lossless_check: the lossless gate's report (`eval/lossless.py`).
        records: one `RunRecord` per prompt turn and method (bench.json leaves them out).
        batch_sizes, batch_skipped, batch_records: the batch-size curve (several `--batch-size`).
        per_prompt: bench.json's runs only: each method's timing per prompt
            (`bench.report_stats.per_prompt_timings`).
        schema_version: the schema these fields follow (`EVAL_SCHEMA`).
    """

    config: dict
    summary: Summary
    hardware: str
    date: str
    commit: str | None
    torch: str
    machine: dict = field(default_factory=dict)
    tree_budgets: dict[str, dict] = field(default_factory=dict)
    drafters: dict[str, dict] = field(default_factory=dict)
    target_variants: dict[str, dict] = field(default_factory=dict)
    lossless_check: dict = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)
    batch_sizes: dict[str, dict] = field(default_factory=dict)
    batch_skipped: dict[str, str] = field(default_factory=dict)
    batch_records: list[dict] = field(default_factory=list)
    per_prompt: dict[str, dict] = field(default_factory=dict)
    schema_version: int = EVAL_SCHEMA

    @property
    def methods(self) -> list[str]:
        """The methods the run compared, plain decoding first."""
        return list(self.summary.get("all", {}))

    def to_dict(self) -> dict:
        """The JSON object eval.json holds (empty optional parts left out)."""
        return _to_dict(self)

    @classmethod
    def from_dict(cls, raw, source: str, fix: str = EVAL_FIX) -> EvalResults:
        """EvalResults from a decoded eval.json; `source` names it and `fix` says how to write
        it again in errors.

        Raises:
            DraftsmithError: not an object, a newer schema, unknown or missing keys, a value of
                the wrong type, or a summary without its `all` row.
        """
        values = _checked_fields(cls, raw, source, EVAL_SCHEMA, "eval.json", fix)
        if not isinstance(values["summary"].get("all"), dict) or \
                not all(isinstance(rows, dict) for rows in values["summary"].values()):
            _refuse(source, "eval.json", "its summary has no `all` row of methods", fix)
        return cls(**values)


@dataclass
class TrainingRecord:
    """One drafter's training in a benchmark (`train/LABEL/budget.json`; bench.json's `training`).
    Fields a record from an earlier version lacks are None.

    Attributes:
        label, kind: the drafter's name in the benchmark and its kind.
        steps: optimizer steps trained; seconds_per_step: measured over the run.
        budget_minutes: its wall-clock budget; train_minutes: what it spent.
        batch_size, features, max_length: its training settings (features: online or offline).
        held_out: the final held-out evaluation (`acc_0`, ..., `simulated_tau`).
        recipe: the recipe file it trained with.
        lora: a Medusa-2 LoRA adapter trained with it; shared_head: Medusa heads on the target's
            output layer (None: not recorded; the recipe says).
        trainable_params: parameters trained (None: count them from the drafter's files).
        tokens_per_second, tokens_seen: real tokens trained per wall second, and in all.
        calibrated_seconds_per_step: the calibration's estimate (None: an older record, whose
            steps the calibration fixed).
        data: what it trained on (folder, conversations, tokens, regenerated, cached).
        extends: the run it trained on from (`kinds.LABEL.extends`): label, step, minutes.
    """

    label: str
    kind: str
    steps: int
    seconds_per_step: float
    budget_minutes: float
    train_minutes: float
    batch_size: int
    features: str
    held_out: dict[str, float]
    recipe: str
    lora: bool = False
    shared_head: bool | None = None
    trainable_params: int | None = None
    tokens_per_second: float | None = None
    tokens_seen: int | None = None
    max_length: int | None = None
    calibrated_seconds_per_step: float | None = None
    data: dict | None = None
    extends: dict | None = None

    def to_dict(self) -> dict:
        """The JSON object budget.json holds (fields not recorded left out)."""
        return {item.name: getattr(self, item.name) for item in dataclasses.fields(self)
                if getattr(self, item.name) is not None}

    @classmethod
    def from_dict(cls, raw, source: str, fix: str = BENCH_FIX) -> TrainingRecord:
        """A TrainingRecord from a decoded budget.json (`source` names it in errors).

        Raises:
            DraftsmithError: not an object, unknown or missing keys, a value of the wrong type.
        """
        return cls(**_checked_fields(cls, raw, source, None, "training record", fix))


@dataclass
class BenchResults:
    """What one `draftsmith bench` run measured (bench.json).

    Attributes:
        config: the benchmark config as recorded (`BenchConfig` with its eval section's record).
        training: per drafter label, its training (`TrainingRecord`).
        eval: per temperature (`f"{t:g}"`, "0" greedy), that evaluation run.
        passes: per `eval.passes` name, that greedy run.
        data: the shared data step's summary.json (None before the data stage ran).
        curves: per drafter label, its held-out evaluation rows over training.
        engines: per engine check (`eagle3 in llama.cpp`), its serve_check summary.
        schema_version: the schema these fields follow (`BENCH_SCHEMA`).
    """

    config: dict
    training: dict[str, TrainingRecord]
    eval: dict[str, EvalResults]
    passes: dict[str, EvalResults] = field(default_factory=dict)
    data: dict | None = None
    curves: dict[str, list[dict]] = field(default_factory=dict)
    engines: dict[str, dict] = field(default_factory=dict)
    schema_version: int = BENCH_SCHEMA

    @property
    def greedy(self) -> EvalResults | None:
        """The temperature-0 evaluation run, where the bars and findings are measured."""
        return self.eval.get("0")

    def to_dict(self) -> dict:
        """The JSON object bench.json holds."""
        out = _to_dict(self)
        for part in ("training", "eval", "passes"):
            out[part] = {name: value.to_dict() for name, value in out[part].items()}
        return out

    @classmethod
    def from_dict(cls, raw, source: str) -> BenchResults:
        """BenchResults from a decoded bench.json (`source` names it in errors).

        Raises:
            DraftsmithError: as `EvalResults.from_dict`, for the file or any run in it.
        """
        values = _checked_fields(cls, raw, source, BENCH_SCHEMA, "bench.json", BENCH_FIX)
        values["training"] = {label: TrainingRecord.from_dict(record, f"{source} (training."
                                                              f"{label})")
                              for label, record in values["training"].items()}
        for part in ("eval", "passes"):
            values[part] = {name: EvalResults.from_dict(run, f"{source} ({part}.{name})",
                                                        BENCH_FIX)
                            for name, run in values.get(part, {}).items()}
        return cls(**values)

    @classmethod
    def coerce(cls, bench: BenchResults | dict, source: str = "a bench.json payload"
               ) -> BenchResults:
        """`bench` as BenchResults: a decoded bench.json goes through `from_dict`."""
        return bench if isinstance(bench, BenchResults) else cls.from_dict(bench, source)


def read_eval_results(path: str | Path) -> EvalResults:
    """The eval.json at `path`, checked (see `EvalResults.from_dict`)."""
    return EvalResults.from_dict(_load(Path(path), "eval.json", EVAL_FIX), str(path))


def read_bench_results(path: str | Path) -> BenchResults:
    """The bench.json at `path`, checked (see `BenchResults.from_dict`)."""
    return BenchResults.from_dict(_load(Path(path), "bench.json", BENCH_FIX), str(path))


def read_training_record(path: str | Path) -> TrainingRecord:
    """A drafter's `train/LABEL/budget.json`, checked (see `TrainingRecord.from_dict`)."""
    fix = "delete it and run the benchmark's train stage again (it trains nothing finished)"
    return TrainingRecord.from_dict(_load(Path(path), "training record", fix), str(path), fix)


def write_training_record(path: str | Path, record: TrainingRecord) -> Path:
    """Write a drafter's budget.json (atomically); returns its path."""
    return write_json(path, record.to_dict())


def write_eval_results(path: str | Path, results: EvalResults) -> Path:
    """Write eval.json (atomically); returns its path."""
    return write_json(path, results.to_dict())


def write_bench_results(path: str | Path, results: BenchResults, indent: int = 2) -> Path:
    """Write bench.json (atomically); returns its path."""
    return write_json(path, results.to_dict(), indent=indent)


def _to_dict(results) -> dict:
    """The dataclass's fields, its schema version first, empty optional parts left out."""
    out = {"schema_version": results.schema_version}
    for item in dataclasses.fields(results):
        value = getattr(results, item.name)
        if item.name != "schema_version" and not (item.name in OMITTED_WHEN_EMPTY and not value):
            out[item.name] = value
    return out


def _load(path: Path, what: str, fix: str):
    """The JSON value in `path`, or one error naming the file and `fix`."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise DraftsmithError(f"{path} does not exist; {fix}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DraftsmithError(f"{path} cannot be read as a {what} ({err}); {fix}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        _refuse(str(path), what, f"it is not JSON, damaged or cut short: {err}", fix)


def _refuse(source: str, what: str, problem: str, fix: str) -> typing.NoReturn:
    article = "an" if what[0] in "aeiou" else "a"
    raise DraftsmithError(f"{source} is not {article} {what} this draftsmith reads ({problem}); "
                          f"{fix}")


def _checked_fields(cls, raw, source: str, schema: int | None, what: str, fix: str) -> dict:
    """`raw`'s fields for `cls`: its schema version (absent: a file from before versions, read
    when its fields are this schema's; `schema` None: a part without a version of its own), its
    keys and each value's type checked."""
    if not isinstance(raw, dict):
        _refuse(source, what, f"it holds a JSON {type(raw).__name__}, not an object", fix)
    version = raw.get("schema_version") if schema is not None else None
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)
                                or version < 1):
        _refuse(source, what, f"schema_version {version!r} is no version", fix)
    if version is not None and version > schema:
        _refuse(source, what, f"it follows schema {version}, newer than this draftsmith's "
                f"{schema}", f"upgrade draftsmith, or {fix}")
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(raw) - set(hints))
    if unknown:
        _refuse(source, what, f"keys no {what} has: {', '.join(unknown)}", fix)
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in raw]
    if missing:
        _refuse(source, what, f"it lacks {', '.join(missing)}", fix)
    for name, value in raw.items():
        if not _is_a(value, hints[name]):
            _refuse(source, what, f"`{name}` is a JSON {type(value).__name__}, where "
                    f"{_describe(hints[name])} belongs", fix)
    return {name: value for name, value in raw.items() if name != "schema_version"}


def _is_a(value, hint) -> bool:
    """Whether a decoded JSON value has the shape of a field's type (its outer type; a run of a
    bench.json, an EvalResults, is an object here and checked by its own reader)."""
    origin = typing.get_origin(hint) or hint
    if origin in (typing.Union, types.UnionType):
        return any(_is_a(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin in (EvalResults, TrainingRecord):
        return isinstance(value, dict)
    if origin is float:  # JSON writes a whole float as an integer
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, origin) and not (origin is int and isinstance(value, bool))


def _describe(hint) -> str:
    """A field's type in JSON words: `an object`, `a string or null`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(option) for option in typing.get_args(hint))
    origin = typing.get_origin(hint) or hint
    return {dict: "an object", list: "a list", str: "a string", int: "an integer",
            float: "a number", bool: "true or false", type(None): "null"}.get(origin, "an object")
