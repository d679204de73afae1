"""What `draftsmith eval` runs: `EvalConfig`, built by the eval CLI and by the benchmark alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.errors import DraftsmithError
from draftsmith.eval.methods import check_hybrid_settings, check_methods
from draftsmith.eval.prompts.sets import PROMPT_SETS
from draftsmith.eval.settings import DecodeSettings
from draftsmith.target.load import FLAGS, TargetSpec, resolve_device
from draftsmith.target.offline_models import DEFAULT_TARGET
from draftsmith.target.quantize import parse_target_quant


@dataclass
class EvalConfig:
    """What `draftsmith eval` runs.

    Attributes:
        target: target spec (offline name, folder, .gguf or Hub id).
        draft_model: classic draft model spec for draft methods, or None.
        drafter: trained drafter folder for the `drafter*` methods, or None.
        drafters: (label, folder) pairs of named drafters evaluated in the same run; their methods
            are written `drafter@label`, `drafter_dynamic@label`, ... (see methods.Method).
        dtype, device: for target and draft model (`auto`: see draftsmith.target.precision).
            `target`, `dtype`, `device` and `trust_remote_code` are checked as one
            `draftsmith.target.load.TargetSpec` (`target_spec()`); eval.json records them as written.
        bench: built-in prompt sets (mt_bench, humaneval, gsm8k).
        prompt_files: the user's prompt files (Spec-Bench / MT-bench JSONL, OpenAI `messages`
            JSONL, or text with one prompt per line; see eval/prompts/files.py).
        limit: items per set (per category of a prompt file).
        max_new_tokens: budget per turn.
        methods: methods in run order; the first is the speedup baseline and supplies MT-bench's
            second-turn context.
        sampling: temperature / top-p / seed (temperature 0 = greedy).
        settings: proposer knobs.
        out_dir: where eval.json and the plots go.
        trust_remote_code: passed to model loading.
        autotune_tree: measure this machine and pick each dynamic-tree method's depth and
            total_tokens (replacing `settings.tree`'s for that method).
        check_lossless: a gate, in float32: greedy, every method (at every batch size) must
            reproduce plain decoding token for token; sampling, every method's first tokens must
            pass a distribution test (eval/lossless.py); `run_eval` raises naming each failure.
        lossless_samples: draws per method and prompt of the sampling gate.
        batch_sizes: batch sizes to measure, 1 first: above 1, plain decoding and the chain
            methods decode batches of prompts at once (eval/batch_sizes.py).
        target_quant: target variants, `none` (the target as loaded) first: every method also
            runs against each quantized copy (eval/target_variants.py, draftsmith/target/quantize.py).
    """

    target: str = DEFAULT_TARGET
    draft_model: str | None = None
    drafter: str | None = None
    drafters: tuple[tuple[str, str], ...] = ()
    dtype: str = "auto"
    device: str = "cpu"
    bench: tuple[str, ...] = ("mt_bench", "humaneval", "gsm8k")
    limit: int = 5
    max_new_tokens: int = 128
    methods: tuple[str, ...] = ("plain", "prompt_lookup")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    settings: DecodeSettings = field(default_factory=DecodeSettings)
    out_dir: str = "runs/eval"
    trust_remote_code: bool = False
    autotune_tree: bool = False
    prompt_files: tuple[str, ...] = ()
    check_lossless: bool = False
    lossless_samples: int = 300
    batch_sizes: tuple[int, ...] = (1,)
    target_quant: tuple[str, ...] = ("none",)

    def __post_init__(self):
        self.batch_sizes = parse_batch_sizes(self.batch_sizes)
        self.target_quant = parse_target_quant(self.target_quant)
        if len(self.target_quant) > 1 and resolve_device(self.device).type != "cpu":
            raise DraftsmithError(f"--target-quant {','.join(self.target_quant)} runs on the CPU "
                                  "(its int8 kernels are CPU kernels); pass --device cpu")
        if "int8" in self.target_quant:  # dynamic int8 quantizes a float32 model
            if self.dtype not in ("auto", "float32"):
                raise DraftsmithError(f"--target-quant {','.join(self.target_quant)} quantizes a "
                                      f"float32 target (dynamic int8); drop --dtype {self.dtype}, "
                                      "pass --dtype float32, or use int8wo (weight-only int8, "
                                      "any float dtype)")
            self.dtype = "float32"
        if isinstance(self.lossless_samples, bool) or not isinstance(self.lossless_samples, int) \
                or self.lossless_samples < 50:
            raise DraftsmithError(f"--lossless-samples {self.lossless_samples!r} must be an "
                                  "integer >= 50 (fewer draws leave the distribution test blind)")
        if self.check_lossless:
            if self.dtype not in ("auto", "float32"):
                raise DraftsmithError(f"--check-lossless runs in float32 (in {self.dtype} near-tied "
                                      "logits flip between one- and multi-token forwards); drop "
                                      "--dtype or pass --dtype float32")
            self.dtype = "float32"
        if self.limit < 1:
            raise DraftsmithError(f"--limit {self.limit} must be >= 1")
        if self.max_new_tokens < 1:
            raise DraftsmithError(f"--max-new-tokens {self.max_new_tokens} must be >= 1")
        if not self.methods or self.methods[0] != "plain":
            self.methods = ("plain", *[m for m in self.methods if m != "plain"])
        self.target_spec()  # checked now, the errors naming the flags
        unknown = [name for name in self.bench if name not in PROMPT_SETS]
        if unknown or not (self.bench or self.prompt_files):
            problem = f"unknown prompt set(s) {unknown}" if unknown else "no prompt set"
            raise DraftsmithError(f"--bench {','.join(self.bench)!r}: {problem}; choose from: "
                                  f"{', '.join(PROMPT_SETS)}")
        labels = [label for label, _ in self.drafters]
        if len(set(labels)) != len(labels) or "" in labels:
            raise DraftsmithError(f"drafter labels {labels} must be distinct and non-empty")
        check_methods(list(self.methods), self.draft_model is not None,
                      [label for label, _ in self.all_drafters()], self.settings.datastore)
        check_hybrid_settings(self.methods, self.settings)
        for label, folder in self.all_drafters():
            flag = f"--drafter {label}={folder}" if label else f"--drafter {folder}"
            if not Path(folder).exists():
                raise DraftsmithError(f"{flag}: {folder} does not exist; pass OUTPUT_DIR/drafter "
                                      "written by `draftsmith train`, or an export folder")
            if not Path(folder).is_dir():
                raise DraftsmithError(f"{flag}: {folder} is a file, not a drafter folder; pass the "
                                      "folder that holds it")

    def target_spec(self) -> TargetSpec:
        """The target's settings as one checked `TargetSpec` (errors name the eval flags).

        Raises:
            DraftsmithError: an empty target, an unknown dtype or an unusable device.
        """
        return TargetSpec(self.target, self.dtype, self.device, self.trust_remote_code,
                          where=FLAGS)

    def all_drafters(self) -> list[tuple[str, str]]:
        """Every drafter of the run as (label, folder); the unlabelled `drafter` has label ""."""
        return ([("", self.drafter)] if self.drafter else []) + list(self.drafters)


def parse_batch_sizes(value: str | tuple | list) -> tuple[int, ...]:
    """`"1,2,4,8"` (or a sequence of ints) -> (1, 2, 4, 8): sorted, deduplicated, 1 included.

    Raises:
        DraftsmithError: a part that is not an integer >= 1, naming it and the fix.
    """
    parts = [p.strip() for p in value.split(",")] if isinstance(value, str) else list(value)
    sizes = set()
    for part in parts:
        text = str(part)
        if isinstance(part, bool) or not text.isdigit() or int(text) < 1:
            given = value if isinstance(value, str) else ",".join(map(str, parts))
            raise DraftsmithError(f"--batch-size {given!r}: {text!r} is not a batch size; give "
                                  "integers >= 1 separated by commas, e.g. --batch-size 1,2,4,8")
        sizes.add(int(text))
    return tuple(sorted(sizes | {1}))


def build_eval_config(*, settings: DecodeSettings | None = None, temperature: float = 0.0,
                      top_p: float = 1.0, seed: int = 0, **fields) -> EvalConfig:
    """An EvalConfig from the decoding knobs (`eval/settings.py`), sampling and the other fields,
    the one way the eval CLI and the benchmark build it. `tree_total_tokens: auto` turns on the
    autotuner (depth and size measured per method on this machine).

    Raises:
        DraftsmithError: a bad sampling setting, naming it.
    """
    settings = settings or DecodeSettings()
    try:
        sampling = SamplingConfig(temperature, top_p, seed)
    except ValueError as err:
        raise DraftsmithError(f"bad sampling setting: {err}") from err
    autotune = settings.autotune or fields.pop("autotune_tree", False)
    return EvalConfig(sampling=sampling, settings=settings, autotune_tree=autotune, **fields)
