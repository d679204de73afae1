"""The benchmark's settings per target (`recipes/bench/*.yaml`), validated with clear errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.config_values import build_dataclass, read_yaml_mapping
from draftsmith.errors import DraftsmithError
from draftsmith.eval.methods import split_method


@dataclass
class KindEntry:
    """One trained drafter of the benchmark.

    Attributes:
        label: its name in the run (methods refer to it as `drafter@label`).
        recipe: the training recipe it starts from (its `data:` section is replaced by the
            benchmark's shared one).
        drafter, train: overrides of the recipe's sections for this drafter.
    """

    label: str
    recipe: str
    drafter: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)


@dataclass
class EvalSection:
    """How the trained drafters and the baselines are evaluated (one run per temperature)."""

    bench: list[str] = field(default_factory=lambda: ["mt_bench", "humaneval", "gsm8k"])
    limit: int = 2
    max_new_tokens: int = 96
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    draft_model: str | None = None
    num_draft_tokens: int = 3
    lookup_tokens: int = 8
    tree: dict = field(default_factory=lambda: {"topk": 3, "depth": 4, "total_tokens": 8})
    autotune_tree: bool = False  # pick depth and size per dynamic-tree method on this machine
    methods: dict = field(default_factory=dict)  # method -> display name, in run order


@dataclass
class BenchConfig:
    """A benchmark of one target.

    Attributes:
        target: the target spec; dtype: the dtype it trains and decodes in.
        data: the data recipe every drafter trains on (prepared once).
        out_dir: everything the benchmark writes for this target (resumable).
        budget_minutes: wall-clock training minutes per drafter on this machine; steps are set
            from a short calibration run of each drafter.
        calibration_steps: steps of that calibration run.
        train: overrides of every drafter's `train:` section.
        kinds: the drafters.
        eval: the evaluation.
        bars: method -> minimum mean tau at temperature 0 (checked in the report).
        speedup_bar: minimum best speedup at temperature 0.
        expected_order: methods from highest to lowest tau as the literature orders them; the
            report checks the measured order against it.
    """

    target: str
    data: str
    out_dir: str
    dtype: str = "auto"
    budget_minutes: float = 8.0
    calibration_steps: int = 6
    train: dict = field(default_factory=dict)
    kinds: list[KindEntry] = field(default_factory=list)
    eval: EvalSection = field(default_factory=EvalSection)
    bars: dict = field(default_factory=dict)
    speedup_bar: float | None = None
    expected_order: list[str] = field(default_factory=list)  # methods by tau, per the literature
    path: str = ""

    def kind(self, label: str) -> KindEntry:
        return next(k for k in self.kinds if k.label == label)


def _section(cls, values, where: str, **extra):
    return build_dataclass(cls, values, where, **extra)


def load_bench_config(path: str | Path) -> BenchConfig:
    """Read and check a benchmark file; every referenced recipe must exist."""
    raw = read_yaml_mapping(path, "benchmark config", "see recipes/bench/")
    kinds = raw.pop("kinds", None) or {}
    if not isinstance(kinds, dict) or not kinds:
        raise DraftsmithError(f"{path}: `kinds` must map drafter labels to {{recipe: FILE}}")
    entries = [_section(KindEntry, dict(v or {}), f"{path}: kinds.{label}", label=label)
               for label, v in kinds.items()]
    evaluation = _section(EvalSection, raw.pop("eval", None) or {}, f"{path}: eval")
    config = _section(BenchConfig, raw, str(path), kinds=entries, eval=evaluation, path=str(path))
    for file in [config.data, *[k.recipe for k in entries]]:
        if not Path(file).is_file():
            raise DraftsmithError(f"{path} refers to {file}, which does not exist")
    if config.budget_minutes <= 0 or config.calibration_steps < 3:
        raise DraftsmithError(f"{path}: budget_minutes must be > 0 and calibration_steps >= 3")
    labels = {k.label for k in entries}
    for method in [*evaluation.methods, *config.bars, *config.expected_order]:
        if method not in evaluation.methods:
            raise DraftsmithError(f"{path}: {method!r} (in bars or expected_order) is not one of "
                                  "the eval methods")
        label = split_method(method)[1]
        if label and label not in labels:
            raise DraftsmithError(f"{path}: eval method {method!r} names no drafter in `kinds` "
                                  f"({', '.join(sorted(labels))})")
    return config
