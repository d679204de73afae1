"""The benchmark's settings per target (`recipes/bench/*.yaml`), validated with clear errors."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from draftsmith.bench.extend import resolve_extensions
from draftsmith.bench.passes import PASS_EXAMPLES, check_pass
from draftsmith.config_values import build_dataclass, read_yaml_mapping
from draftsmith.engines.engine_env import own_engine_python, require_gpu_engine
from draftsmith.errors import DraftsmithError
from draftsmith.eval.methods import Method, check_methods
from draftsmith.eval.settings import DecodeSettings, bench_keys, decode_settings_from_mapping
from draftsmith.registry import get_spec, served_by
from draftsmith.serving import ENGINES
from draftsmith.target.load import TargetSpec


@dataclass
class KindEntry:
    """One trained drafter of the benchmark.

    Attributes:
        label: its name in the run (methods refer to it as `drafter@label`).
        recipe: the training recipe it starts from (its `data:` section is replaced by the
            benchmark's shared one).
        drafter, train: overrides of the recipe's sections for this drafter.
        data: a data recipe of its own instead of the shared one (prepared into
            `out_dir/data-<its file name>`, shared by the entries naming the same file): how a
            drafter scales with data, the other entries as the reference.
        budget_minutes: its own wall-clock budget instead of the benchmark's.
        extends: another drafter's label: this one is that run trained on to `budget_minutes`
            from its last checkpoint before the decay (bench/extend.py; it takes that drafter's
            recipe and settings and sets none of its own).
    """

    label: str
    recipe: str | None = None
    drafter: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    data: str | None = None
    budget_minutes: float | None = None
    extends: str | None = None


@dataclass
class EvalSection:
    """How the trained drafters and the baselines are evaluated (one run per temperature)."""

    bench: list[str] = field(default_factory=lambda: ["mt_bench", "humaneval", "gsm8k"])
    limit: int = 2
    max_new_tokens: int = 96
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    draft_model: str | None = None
    # the decoding knobs (eval/settings.py), each a key of this section (num_draft_tokens,
    # lookup_tokens, tree_topk, ...; `tree: {topk, depth, total_tokens}` sets the tree's three)
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    autotune_tree: bool = False  # pick depth and size per dynamic-tree method on this machine
    methods: dict = field(default_factory=dict)  # method -> display name, in run order
    check_lossless: bool = False  # the greedy run also gates every method on plain's output
    datastore: bool = False  # REST reads the data step's datastore (data.datastore)
    # extra greedy runs, each in its own folder: name -> {methods: [...], batch_sizes: [...],
    # target_quant: [...]} (the batch-size curve; the quantized-target rows), or {methods: [...],
    # check_lossless: true, limit: N, max_new_tokens: N} (the float32 lossless gate, so the main
    # run can time the machine's own dtype)
    passes: dict = field(default_factory=dict)

    def __post_init__(self):
        """Checked when the file is read, not hours later when the evaluation starts."""
        from draftsmith.eval.prompts.sets import PROMPT_SETS

        if not isinstance(self.passes, dict):
            raise DraftsmithError(f"eval.passes = {self.passes!r}: map a pass name to "
                                  f"{PASS_EXAMPLES}")
        for name, spec in self.passes.items():
            check_pass(name, spec)

        unknown = [name for name in self.bench if name not in PROMPT_SETS] if isinstance(
            self.bench, list) else [self.bench]
        if unknown or not self.bench:
            raise DraftsmithError(f"eval.bench = {self.bench!r}: list one or more of: "
                                  f"{', '.join(PROMPT_SETS)}")
        for name in ("limit", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or value < 1:
                raise DraftsmithError(f"eval.{name} = {value!r}: must be an integer >= 1")
        if not isinstance(self.temperatures, list) or not self.temperatures or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0
                for t in self.temperatures):
            raise DraftsmithError(f"eval.temperatures = {self.temperatures!r}: list one or more "
                                  "numbers >= 0 (0 = greedy), e.g. [0.0, 1.0]")
        if not isinstance(self.methods, dict):
            raise DraftsmithError(f"eval.methods = {self.methods!r}: map each method to its "
                                  "display name, e.g. {prompt_lookup: prompt lookup}")

    def record(self) -> dict:
        """The section as bench.json records it: its own keys, each decoding knob at the top
        level and the tree also as `tree: {topk, depth, total_tokens}` (the report reads both
        older and newer files so)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "decode"}
        knobs = asdict(self.decode)
        tree = {"topk": knobs["tree_topk"], "depth": knobs["tree_depth"],
                "total_tokens": knobs["tree_total_tokens"]}
        return {**own, **knobs, "tree": tree}


def eval_section(values: dict, where: str) -> EvalSection:
    """The `eval:` section of a benchmark file, its decoding knobs (`bench_keys`) read into
    DecodeSettings and the legacy `tree: {topk, depth, total_tokens}` into tree_topk, ...

    Raises:
        DraftsmithError: a bad key or value, named as the file's key.
    """
    values = dict(values)
    tree = values.pop("tree", None)
    if tree is not None:
        keys = {"topk", "depth", "total_tokens"}
        if not isinstance(tree, dict) or set(tree) != keys:
            raise DraftsmithError(f"{where}.tree = {tree!r}: give topk, depth and total_tokens, "
                                  "each an integer >= 1, e.g. {topk: 3, depth: 4, total_tokens: 8}")
        values.update({f"tree_{key}": value for key, value in tree.items()})
    knobs = {key: values.pop(key) for key in bench_keys() if key in values}
    decode = decode_settings_from_mapping(knobs, where)
    return build_dataclass(EvalSection, values, where, decode=decode)


@dataclass
class BenchConfig:
    """A benchmark of one target.

    Attributes:
        target: the target spec; dtype: the dtype it trains and decodes in (checked as one
            `draftsmith.target.load.TargetSpec`, `target_spec()`; bench.json records them as written).
        data: the data recipe every drafter trains on (prepared once).
        out_dir: everything the benchmark writes for this target (resumable).
        budget_minutes: wall-clock training minutes per drafter (each run's `train.max_minutes`).
        calibration_steps: steps of a short calibration run of each drafter, whose step estimate
            sets the warmup, the checkpoint and evaluation cadence and the ceiling on steps.
        train: overrides of every drafter's `train:` section.
        kinds: the drafters.
        eval: the evaluation.
        bars: method -> minimum mean tau at temperature 0 (checked in the report).
        speedup_bar: minimum best speedup at temperature 0.
        relative_bars: one method against another at temperature 0, each `{method, metric, than,
            factor}`: metric `speedup` (met when method's > factor x than's) or `draft_share` (the
            share of decode time spent drafting; met when method's <= factor x than's); factor
            defaults to 1.
        expected_order: methods from highest to lowest tau as the literature orders them; the
            report checks the measured order against it.
        engine: the engine checks (`bench/engine_stage.py`), one or a list: a drafter's label
            (a kind the engines serve: EAGLE-3, DFlash) and optionally engines, draft_max,
            limit, max_new_tokens (default: the eval's chain length or a block drafter's block,
            limit and new tokens) and outtypes (llama.cpp's draft GGUF types, one run each);
            empty = none.
        device: where every stage computes: `auto` (a GPU when one is visible), `cpu`, `cuda` or
            `cuda:N`; data preparation, training (a `cpu` run hides the GPUs from it), the
            evaluations (passes comparing int8 targets run on the CPU: CPU kernels) and the
            engine check. `draftsmith bench --device` overrides it.
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
    relative_bars: list = field(default_factory=list)
    expected_order: list[str] = field(default_factory=list)  # methods by tau, per the literature
    engine: dict | list = field(default_factory=dict)  # one check or a list (ENGINE_KEYS)
    device: str = "auto"
    name: str | None = None  # its name in BENCHMARKS.md and under benchmarks/ (default: target)
    path: str = ""

    def engine_checks(self) -> list[dict]:
        """The engine checks as a list (`engine:` may hold one)."""
        if not self.engine:
            return []
        return list(self.engine) if isinstance(self.engine, list) else [self.engine]

    def kind(self, label: str) -> KindEntry:
        return next(k for k in self.kinds if k.label == label)

    def target_spec(self) -> TargetSpec:
        """The target's settings as one checked `TargetSpec` (each stage places it on
        `compute_device()`; training on its process's device, which that decides).

        Raises:
            DraftsmithError: an empty target or an unknown dtype, named as the file's keys.
        """
        return TargetSpec(self.target, self.dtype, device=None, where="")

    def compute_device(self) -> str:
        """`device` resolved (`auto`: cuda when a GPU is visible, else cpu).

        Raises:
            DraftsmithError: an unknown device, or CUDA where no GPU is visible.
        """
        from draftsmith.target.load import resolve_device

        return str(resolve_device(self.device, "device"))


def _section(cls, values, where: str, **extra):
    return build_dataclass(cls, values, where, **extra)


def load_bench_config(path: str | Path, device: str | None = None) -> BenchConfig:
    """Read and check a benchmark file; every referenced recipe must exist. `device` (the
    command line's `--device`) replaces the file's."""
    raw = read_yaml_mapping(path, "benchmark config", "see recipes/bench/")
    kinds = raw.pop("kinds", None) or {}
    if not isinstance(kinds, dict) or not kinds:
        raise DraftsmithError(f"{path}: `kinds` must map drafter labels to {{recipe: FILE}}")
    entries = [_section(KindEntry, dict(v or {}), f"{path}: kinds.{label}", label=label)
               for label, v in kinds.items()]
    evaluation = eval_section(raw.pop("eval", None) or {}, f"{path}: eval")
    config = _section(BenchConfig, raw, str(path), kinds=entries, eval=evaluation, path=str(path))
    resolve_extensions(entries, path, config.budget_minutes)
    for file in [config.data, *[k.recipe for k in entries], *[k.data for k in entries if k.data]]:
        if not Path(file).is_file():
            raise DraftsmithError(f"{path} refers to {file}, which does not exist")
    if config.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", config.name):
        raise DraftsmithError(f"{path}: name = {config.name!r} must be one plain file name "
                              "(letters, digits, '.', '_', '-'): it names the benchmark's "
                              "folder under benchmarks/, e.g. name: llama-8b-eagle3")
    if config.budget_minutes <= 0 or config.calibration_steps < 3:
        raise DraftsmithError(f"{path}: budget_minutes must be > 0 and calibration_steps >= 3")
    for entry in entries:
        if entry.budget_minutes is not None and not entry.budget_minutes > 0:
            raise DraftsmithError(f"{path}: kinds.{entry.label}.budget_minutes = "
                                  f"{entry.budget_minutes!r} must be > 0")
    if device is not None:
        from draftsmith.target.load import resolve_device

        resolve_device(device, "--device")  # named as the flag it came from
        config.device = device
    try:
        config.target_spec()
        config.compute_device()
    except DraftsmithError as err:
        raise DraftsmithError(f"{path}: {err}") from None
    for where, spec in [("eval", {"check_lossless": evaluation.check_lossless}),
                        *[(f"eval.passes.{n}", v) for n, v in evaluation.passes.items()]]:
        why = ("check_lossless: true (the gate runs in float32)" if spec.get("check_lossless")
               else "target_quant int8 (dynamic int8 quantizes a float32 target)"
               if "int8" in spec.get("target_quant", []) else None)
        if why and config.dtype not in ("auto", "float32"):
            raise DraftsmithError(f"{path}: {where} has {why}, but dtype = {config.dtype!r}; set "
                                  "dtype: auto or float32, or drop that setting")
    labels = {k.label for k in entries}
    for method in [*evaluation.methods, *config.bars, *config.expected_order]:
        if method not in evaluation.methods:
            raise DraftsmithError(f"{path}: {method!r} (in bars or expected_order) is not one of "
                                  "the eval methods")
        label = Method.parse(method).label
        if label and label not in labels:
            raise DraftsmithError(f"{path}: eval method {method!r} names no drafter in `kinds` "
                                  f"({', '.join(sorted(labels))})")
    _check_relative_bars(config, path)
    passes = [m for spec in evaluation.passes.values() for m in spec["methods"]]
    for method in passes:
        label = Method.parse(method).label
        if label and label not in labels:
            raise DraftsmithError(f"{path}: eval.passes method {method!r} names no drafter in "
                                  f"`kinds` ({', '.join(sorted(labels))})")
    _check_engine(config, path)
    methods = list(dict.fromkeys([*evaluation.methods, *passes]))
    if "rest" in methods and not evaluation.datastore:
        raise DraftsmithError(f"{path}: eval method 'rest' retrieves from the data step's "
                              "datastore: set eval.datastore: true and data.datastore in "
                              f"{config.data}")
    try:  # the datastore is made by the data step, later: only its presence is checked here
        check_methods(["plain", *[m for m in methods if m != "rest"]],
                      evaluation.draft_model is not None, labels)
    except DraftsmithError as err:
        message = str(err).replace("add --draft-model", "set eval.draft_model")
        raise DraftsmithError(f"{path}: eval.methods: {message}") from None
    return config


RELATIVE_METRICS = ("speedup", "draft_share")  # higher is better / lower is better


def _check_relative_bars(config: BenchConfig, path) -> None:
    """Each `relative_bars` entry compares two eval methods by a known metric and a factor > 0.

    Raises:
        DraftsmithError: naming the entry, what is wrong and an example.
    """
    example = ("e.g. relative_bars: [{method: drafter_dynamic@dflash, metric: speedup, "
               "than: drafter_dynamic@eagle3}, {method: drafter_dynamic@dflash, metric: "
               "draft_share, than: drafter_dynamic@eagle3, factor: 0.333}]")
    if not isinstance(config.relative_bars, list):
        raise DraftsmithError(f"{path}: relative_bars = {config.relative_bars!r} must be a list; "
                              f"{example}")
    for i, bar in enumerate(config.relative_bars):
        where = f"{path}: relative_bars[{i}] = {bar!r}"
        if not isinstance(bar, dict) or set(bar) - {"method", "metric", "than", "factor"} or \
                not {"method", "metric", "than"} <= set(bar):
            raise DraftsmithError(f"{where}: give method, metric, than and optionally factor; "
                                  f"{example}")
        if bar["metric"] not in RELATIVE_METRICS:
            raise DraftsmithError(f"{where}: metric must be one of {', '.join(RELATIVE_METRICS)}")
        for key in ("method", "than"):
            if bar[key] not in config.eval.methods:
                raise DraftsmithError(f"{where}: {key} {bar[key]!r} is not one of the eval "
                                      "methods")
        factor = bar.get("factor", 1.0)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 0:
            raise DraftsmithError(f"{where}: factor must be a number > 0")


ENGINE_KEYS = {"drafter", "draft_max", "limit", "max_new_tokens", "engines", "outtypes",
               "target_outtype"}


def _check_engine(config: BenchConfig, path) -> None:
    """Each `engine:` check names a drafter of `kinds` the engines serve; its counts are integers
    >= 1; outtypes are llama.cpp's draft GGUF types."""
    if not isinstance(config.engine, dict | list):
        raise DraftsmithError(f"{path}: engine = {config.engine!r}: give one check (a mapping) "
                              "or a list of them")
    for spec in config.engine_checks():
        _check_one_engine(config, spec, path)


def _check_one_engine(config: BenchConfig, spec, path) -> None:
    from draftsmith.llama_cpp.convert import OUTTYPES

    hint = ("e.g. engine: {drafter: eagle3, draft_max: 3, engines: [llama.cpp, vllm]} or a list "
            "with {drafter: dflash, outtypes: [f32, f16, q8_0]}")
    if not isinstance(spec, dict) or set(spec) - ENGINE_KEYS or "drafter" not in spec:
        raise DraftsmithError(f"{path}: engine = {spec!r}: give `drafter` (a label of kinds) and "
                              f"optionally {', '.join(sorted(ENGINE_KEYS - {'drafter'}))}; {hint}")
    outtypes = spec.get("outtypes", ["f32"])
    if not isinstance(outtypes, list) or not outtypes or set(outtypes) - set(OUTTYPES) or \
            len(set(outtypes)) < len(outtypes):
        raise DraftsmithError(f"{path}: engine.outtypes = {outtypes!r}: distinct draft GGUF types "
                              f"among {', '.join(OUTTYPES)}; {hint}")
    target_outtype = spec.get("target_outtype")
    if target_outtype is not None and target_outtype not in OUTTYPES:
        raise DraftsmithError(f"{path}: engine.target_outtype = {target_outtype!r}: one of "
                              f"{', '.join(OUTTYPES)} (llama.cpp serves the target's folder "
                              "converted to it; f32: the weights the loop decodes); {hint}")
    engines = spec.get("engines", ["llama.cpp"])
    if not isinstance(engines, list) or not engines or set(engines) - set(ENGINES):
        raise DraftsmithError(f"{path}: engine.engines = {engines!r}: a list of "
                              f"{', '.join(ENGINES)}; {hint}")
    for engine in engines:  # a $DRAFTSMITH_*_PYTHON naming no engine fails now, not after training
        own_engine_python(engine)
        require_gpu_engine(engine, config.compute_device())
    labels = {k.label: k for k in config.kinds}
    if spec["drafter"] not in labels:
        raise DraftsmithError(f"{path}: engine.drafter {spec['drafter']!r} is not in `kinds` "
                              f"({', '.join(sorted(labels))})")
    entry = labels[spec["drafter"]]
    recipe = read_yaml_mapping(entry.recipe, "recipe", "recipes live in recipes/")
    kind = {**(recipe.get("drafter") or {}), **entry.drafter}.get("kind")
    served = [engine for engine in engines
              if engine not in get_spec(kind).engine_methods]
    if served:
        raise DraftsmithError(f"{path}: engine.drafter {spec['drafter']!r} is a {kind} drafter; "
                              f"the engine check runs {' / '.join(served_by(served[0]))} "
                              f"drafters in {served[0]}, which does not serve {kind}")
    for key in ENGINE_KEYS - {"drafter", "engines", "outtypes", "target_outtype"}:
        value = spec.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DraftsmithError(f"{path}: engine.{key} = {value!r}: must be an integer >= 1")
