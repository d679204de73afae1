"""Training recipes: YAML files parsed into validated dataclasses, with `section.key=value` overrides.

A recipe names the target, the drafter kind and its settings, the data and the optimisation
hyper-parameters. Unknown keys are an error that names the key and lists the valid ones; the
recipe is validated before any model is loaded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path

from draftsmith.config_values import apply_overrides, build_dataclass, read_yaml_mapping
from draftsmith.errors import DraftsmithError
from draftsmith.models.row_buckets import DEFAULT_MULTIPLE
from draftsmith.registry import DRAFTERS, get_spec
from draftsmith.target.load import TargetSpec
from draftsmith.target.precision import MIXED_PRECISIONS
from draftsmith.train.budget import SCHEDULES
from draftsmith.train.optimizers import check_optimizer

BATCHINGS = ("tokens", "packed", "rows")


@dataclass
class TrainSection:
    """Optimisation and bookkeeping.

    Attributes:
        lr: peak learning rate (AdamW betas 0.9, 0.95).
        weight_decay: AdamW weight decay.
        optimizer: `adamw` (every parameter) or `muon` (torch.optim.Muon for the drafter's 2-D
            matrix weights, AdamW for norms, biases, embeddings and heads; see
            train/optimizers.py), both on the same schedule.
        muon_lr: Muon's peak learning rate; null = 10 x lr (speculators 0.9 defaults it to lr;
            at 1e-3 its recipe learned least in benchmarks/peer-recipe/).
        batch_size: sequences per process per micro-step (`batching: rows`); with `batching:
            tokens`, batch_size x max_length is each process's padded tokens per micro-step.
        batching: `tokens` (length-bucketed batches of about `batch_tokens` padded tokens each,
            any number of rows: padding 1.7% against 26% on the quickstart's
            conversations, benchmarks/train_step/loop-throughput.md), `packed` (conversations
            back to back in rows of max_length, batch_tokens // max_length rows a batch, each
            attending within itself: `train/packing.py`) or `rows` (batch_size
            sequences paired at random, right-padded to the longest).
        batch_tokens: `batching: tokens` or `packed`: padded tokens per process per
            micro-step; null = batch_size x max_length.
        loader_workers: DataLoader worker processes collating in-memory examples (0: the main
            process; a background thread reads the cache ahead either way); null = 0 on a CPU
            (workers would compete with the step for its cores; not yet timed), 2 with CUDA.
        log_interval: optimizer steps per metrics row: the loop reads the device once per row
            (the loss, metrics and tokens of the steps since the last, reduced over processes
            then) and checks the loss for NaN there and before every checkpoint; with several
            processes a stop signal is also acted on at a row.
        grad_accum: micro-steps per optimizer step.
        max_steps: optimizer steps in total (with `max_minutes`, the most it may take).
        max_minutes: wall-clock budget of the training (from building the drafter to saving
            it; loading the target and preparing the data are not counted): after its first few
            steps the loop plans the run's total steps (and so the LR schedule) from the pace
            measured here, at most max_steps, and revises it after every step from the padded
            tokens per second of the last 16 steps (or of the last 2% of the budget, when more),
            while the schedule can take a new total (constant: always; wsd: until its decay
            starts; cosine: in the first half of the run); each revision is a metrics.jsonl row and a printed line. A resumed run starts
            from the total its checkpoint recorded and counts the minutes spent before it; one
            resumed from a checkpoint where the schedule can still take a new total may set
            another max_minutes (the run extended or cut to it). None = steps only.
        warmup_steps: linear warmup before the schedule.
        schedule: `wsd` (warmup-stable-decay: peak rate until the last `decay_fraction` of the
            steps, then linear to zero; the default: at 80 EAGLE-3 steps it beat cosine, simulated
            tau 1.254 vs 1.222, and the short runs this project makes on CPUs spent a third of
            cosine's steps below a quarter of the peak rate), `cosine` (decay to zero over the run)
            or `constant` (1.263 in that measurement; no decay for a run that goes on).
        decay_fraction: share of the steps `wsd` spends decaying.
        max_length: tokens per sequence (longer ones are truncated).
        clip: gradient norm clip (0 disables).
        mixed_precision: "auto" (bf16 where the hardware runs it fast, by the same measurement as
            `target.dtype: auto`), "no", "bf16" or "fp16" (accelerate autocast).
        save_every: optimizer steps between resumable checkpoints (0 = only at the end). A run
            resumes from its newest complete checkpoint in `output_dir` only with the settings,
            target, data and number of processes it started with (otherwise it stops, naming what
            changed); only save_every, eval_every, keep_checkpoints, the wandb settings and the
            paths may change. To train longer, start a new run.
        keep_checkpoints: how many of the newest checkpoints to keep; older ones are deleted once
            a newer one is complete (0 or null = keep all), but for a `max_minutes` run's newest
            one from before its decay, which training it on to a longer budget resumes from.
        eval_every: optimizer steps between held-out evaluations (0 = only at the end).
        eval_fraction: share of the data held out for accuracy / simulated acceptance.
        eval_max_samples: at most this many held out (the first of the seeded split; the rest
            train), so each evaluation costs bounded time on large data (null = no cap).
        seed: seed for data order, init and noise.
        output_dir: checkpoints, metrics.jsonl and the final drafter go here.
        wandb: log to Weights & Biases (offline mode when no API key is set).
        wandb_project: project name for wandb.
        features: "online" (the frozen target runs inside each step) or "offline" (hidden states
            read from the data pipeline's cache; needs `data.cache` with this drafter kind).
            Offline, each process streams its own shards of the cache (`CacheStream`): host
            memory does not grow with the cache.
        cache_window: offline only: cache shards each process shuffles together (samples mix
            within a window; it holds that many shards memory-mapped).
        gradient_checkpointing: recompute the drafter's decoder layer in backward instead of
            keeping its activations (less memory, about one more forward of the layer per step).
        compile: `torch.compile` the drafter's decoder layer (EAGLE-1/3, P-EAGLE; dynamic
            shapes, since token batches and packed rows change size): the first steps pay the
            compilation. Off by default: see benchmarks/train_step for where it pays.
        bucket_rows: every linear layer of the drafter sees its row count rounded up to this
            multiple (zero rows, sliced off: `models/row_buckets.py`), so a CPU's bf16 matmuls
            reuse their oneDNN kernels instead of building one per new shape (1.14x per step
            measured on a 2-core Xeon); 1 = off; null = 64 on a CPU with bf16 mixed precision,
            off elsewhere (float32 and GPUs build no kernel per shape).
        reuse_host_memory: a run on CPU keeps freed host memory for reuse (glibc's malloc,
            `draftsmith/host_memory.py`) instead of paying page faults for every large tensor
            again: 1.12x per step measured on a 2-core Xeon. Off: the allocator as it is.
        overlap_target: online features: the next batch's frozen-target forward runs on a
            second thread while this step trains the drafter (`train/target_ahead.py`), on the
            cores the drafter's step leaves idle (benchmarks/train_step). null = on for a CPU
            run in one process, off elsewhere (not measured there); true is refused where the
            target's forward is a collective (a sharded target) or trains (Medusa-2), false
            runs it inside the step. The step's numbers are the same either way.
    """

    lr: float = 1e-4
    weight_decay: float = 0.0
    optimizer: str = "adamw"
    muon_lr: float | None = None
    batch_size: int = 4
    batching: str = "tokens"
    batch_tokens: int | None = None
    loader_workers: int | None = None
    bucket_rows: int | None = None
    log_interval: int = 1
    grad_accum: int = 1
    max_steps: int = 200
    max_minutes: float | None = None
    warmup_steps: int = 20
    schedule: str = "wsd"  # measured: benchmarks/schedules/quickstart-eagle3.json
    decay_fraction: float = 0.2
    max_length: int = 512
    clip: float = 0.5
    mixed_precision: str = "auto"
    save_every: int = 0
    keep_checkpoints: int | None = 3
    eval_every: int = 0
    eval_fraction: float = 0.05
    eval_max_samples: int | None = None
    seed: int = 0
    output_dir: str = "runs/train"
    wandb: bool = False
    wandb_project: str = "draftsmith"
    features: str = "online"
    cache_window: int = 4
    gradient_checkpointing: bool = False
    compile: bool = False
    reuse_host_memory: bool = True
    overlap_target: bool | None = None

    def __post_init__(self):
        positive = ("lr", "batch_size", "grad_accum", "max_steps", "max_length", "cache_window",
                    "log_interval")
        for name in positive:
            if getattr(self, name) <= 0:
                raise DraftsmithError(f"train.{name}={getattr(self, name)} must be > 0")
        check_optimizer(self.optimizer)
        if self.muon_lr is not None and self.muon_lr <= 0:
            raise DraftsmithError(f"train.muon_lr={self.muon_lr} must be > 0 (or null for 10 x lr)")
        if self.muon_lr is not None and self.optimizer != "muon":
            raise DraftsmithError(f"train.muon_lr={self.muon_lr:g} is Muon's rate but "
                                  f"train.optimizer={self.optimizer!r} trains without Muon, so "
                                  "it would be ignored; set train.optimizer=muon to use it, or "
                                  "remove train.muon_lr (train.muon_lr=null)")
        if self.schedule not in SCHEDULES:
            raise DraftsmithError(f"train.schedule={self.schedule!r}: use one of "
                                  f"{', '.join(SCHEDULES)}")
        if not 0 < self.decay_fraction <= 1:
            raise DraftsmithError(f"train.decay_fraction={self.decay_fraction} must be in (0, 1]")
        for name in ("gradient_checkpointing", "compile", "reuse_host_memory"):
            if not isinstance(getattr(self, name), bool):
                raise DraftsmithError(f"train.{name}={getattr(self, name)!r}: use true or false")
        self._check_batching()
        if self.features not in ("online", "offline"):
            raise DraftsmithError(f"train.features={self.features!r}: use online or offline")
        if self.overlap_target and self.features == "offline":
            raise DraftsmithError("train.overlap_target=true overlaps the target's forward, but "
                                  "train.features=offline reads cached features and runs no "
                                  "target; set train.features=online, or remove "
                                  "train.overlap_target")
        if self.mixed_precision not in MIXED_PRECISIONS:
            raise DraftsmithError(f"train.mixed_precision={self.mixed_precision!r}: use one of "
                                  f"{', '.join(MIXED_PRECISIONS)}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise DraftsmithError(f"train.max_minutes={self.max_minutes} must be > 0 (or null)")
        for name in ("save_every", "eval_every", "warmup_steps", "seed"):
            if getattr(self, name) < 0:
                raise DraftsmithError(f"train.{name}={getattr(self, name)} must be >= 0")
        if self.keep_checkpoints is not None and self.keep_checkpoints < 0:
            raise DraftsmithError(f"train.keep_checkpoints={self.keep_checkpoints} must be >= 1 "
                                  "(keep that many newest checkpoints), or 0 or null to keep all")
        if not 0 <= self.eval_fraction < 1:
            raise DraftsmithError(f"train.eval_fraction={self.eval_fraction} must be in [0, 1)")
        if self.eval_max_samples is not None and self.eval_max_samples < 1:
            raise DraftsmithError(f"train.eval_max_samples={self.eval_max_samples} must be >= 1 "
                                  "(or null for no cap)")
        if self.warmup_steps < 0 or self.warmup_steps > self.max_steps:
            raise DraftsmithError(f"train.warmup_steps={self.warmup_steps} must be in "
                                  f"[0, max_steps={self.max_steps}]")

    def _check_batching(self) -> None:
        if self.batching not in BATCHINGS:
            raise DraftsmithError(f"train.batching={self.batching!r}: use one of "
                                  f"{', '.join(BATCHINGS)}")
        if self.batch_tokens is not None and self.batch_tokens < self.max_length:
            raise DraftsmithError(f"train.batch_tokens={self.batch_tokens} is below "
                                  f"train.max_length={self.max_length}: a batch must hold one "
                                  "sequence; raise it, or null for batch_size x max_length")
        if self.bucket_rows is not None and self.bucket_rows < 1:
            raise DraftsmithError(f"train.bucket_rows={self.bucket_rows} must be >= 1 (1: off), "
                                  "or null to choose by device")
        if self.loader_workers is not None and self.loader_workers < 0:
            raise DraftsmithError(f"train.loader_workers={self.loader_workers} must be >= 0 "
                                  "(or null to choose by device)")

    @property
    def token_budget(self) -> int:
        """Padded tokens per process per micro-step under `batching: tokens`."""
        return self.batch_tokens or self.batch_size * self.max_length

    def row_multiple(self, device_type: str, mixed_precision: str) -> int:
        """`bucket_rows`: the setting, or 64 on a CPU with bf16 mixed precision and 1 (off)
        elsewhere."""
        if self.bucket_rows is not None:
            return self.bucket_rows
        return DEFAULT_MULTIPLE if (device_type, mixed_precision) == ("cpu", "bf16") else 1

    def overlaps_target(self, device_type: str, num_processes: int) -> bool:
        """`overlap_target`: the setting, or on for online features on a CPU in one process."""
        if self.overlap_target is not None:
            return self.overlap_target
        return self.features == "online" and device_type == "cpu" and num_processes == 1

    @property
    def workers(self) -> int:
        """DataLoader workers: the setting, or 0 on a CPU and 2 with CUDA."""
        import torch

        if self.loader_workers is not None:
            return self.loader_workers
        return 2 if torch.cuda.is_available() else 0


@dataclass
class Recipe:
    """A whole recipe. `drafter` holds `kind` plus that kind's config fields; `data` is passed to
    the data pipeline. The target has no `device` key: each process loads it on its own device,
    as accelerate chose it."""

    target: TargetSpec = field(default_factory=lambda: TargetSpec(device=None))
    drafter: dict = field(default_factory=lambda: {"kind": "eagle3"})
    data: dict = field(default_factory=dict)
    train: TrainSection = field(default_factory=TrainSection)

    @property
    def kind(self) -> str:
        return self.drafter.get("kind", "")

    @cached_property
    def drafter_config(self):
        """The kind's config dataclass, built (and validated) once from the `drafter:` section;
        everything downstream reads this one."""
        spec = get_spec(self.kind)
        return spec.make_config({k: v for k, v in self.drafter.items() if k != "kind"})

    @cached_property
    def data_recipe(self):
        """The data pipeline's recipe for this training recipe (same target, its `data:` section
        with what the drafter kind needs), built and validated once on first use (a recipe of
        pre-tokenized data, `data.tokenized`, never builds one).

        Raises:
            DraftsmithError: a bad `data:` setting, naming it.
        """
        from draftsmith.data.config import DataConfig, DataRecipe, data_for_drafter

        target = replace(self.target, device="cpu")  # a data recipe's default; train loads it
        return DataRecipe(target=target,
                          data=DataConfig.from_dict(data_for_drafter(self.data, self.drafter)))

    def check_sections(self) -> None:
        """Build every typed section now (the drafter's settings, and the data recipe unless the
        data is pre-tokenized), so a bad setting is refused before any model is loaded."""
        for section in ("drafter_config", *(() if "tokenized" in self.data else ("data_recipe",))):
            getattr(self, section)  # a cached property: built and checked once, here

    def to_dict(self) -> dict:
        """The recipe's settings as plain values (what checkpoints and the drafter record)."""
        values = asdict(self)
        del values["target"]["device"]  # not a setting of a training recipe
        return values


def build_recipe(raw: dict) -> Recipe:
    """Validate a raw mapping (from YAML) into a Recipe."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - {"target", "drafter", "data", "train"})
    if unknown:
        raise DraftsmithError(f"unknown recipe section(s) {unknown}; valid: data, drafter, "
                              "target, train")
    target = build_dataclass(TargetSpec, raw.get("target") or {}, "target", device=None)
    train = build_dataclass(TrainSection, raw.get("train") or {}, "train")
    drafter = dict(raw.get("drafter") or {})
    if "kind" not in drafter:
        raise DraftsmithError("recipe section 'drafter' needs a 'kind' (see draftsmith/registry.py)")
    recipe = Recipe(target=target, drafter=drafter, data=dict(raw.get("data") or {}),
                    train=train)
    # the kind and its settings are validated now, before any model is loaded
    check_block_fits(recipe.drafter_config, recipe)
    if train.batching == "packed" and not get_spec(recipe.kind).packs:
        packing = ", ".join(k for k, s in DRAFTERS.items() if s.packs)
        raise DraftsmithError(f"train.batching=packed: the {recipe.kind} loss does not yet keep "
                              f"its labels within each packed conversation (kinds that do: "
                              f"{packing}); use train.batching: tokens (length-bucketed, little "
                              "padding)")
    return recipe


def check_block_fits(drafter_config, recipe: Recipe) -> None:
    """A block drafter's block (`drafter.block_size`) must fit in a training sequence: a longer
    one trains no block and its buffers grow with the block (100,000 asked for 320 GB).

    Raises:
        DraftsmithError: naming both settings and the largest block that fits.
    """
    block = getattr(drafter_config, "block_size", None)
    limits = {"train.max_length": recipe.train.max_length}
    data_length = recipe.data.get("max_length")
    if isinstance(data_length, int) and not isinstance(data_length, bool):
        limits["data.max_length"] = data_length
    key, length = min(limits.items(), key=lambda item: item[1])
    if isinstance(block, int) and block > length:
        raise DraftsmithError(f"drafter.block_size={block} is longer than the training sequences "
                              f"({key}={length} tokens): a block (the anchor and its proposals) "
                              f"must fit in one; use at most {length} (DFlash's reference is 16)"
                              f" or raise {key}")


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, override and validate a recipe file."""
    raw = apply_overrides(read_yaml_mapping(path, "recipe", "recipes live in recipes/"),
                          overrides or [], recipe_schema)
    target = raw.get("target")
    if not isinstance(target, dict) or not target.get("name"):
        raise DraftsmithError(f"recipe {path} names no target; add `target: {{name: NAME}}` (an "
                              "offline model such as smollm2-135m-instruct, a folder, a .gguf file "
                              "or a Hub id) or pass target.name=NAME")
    return build_recipe(raw)


def recipe_schema(values: dict) -> dict:
    """Each recipe section's dataclass (the drafter's depends on its kind), for typed overrides."""
    from draftsmith.data.config import DataConfig
    from draftsmith.registry import DRAFTERS

    drafter = values.get("drafter")
    kind = drafter.get("kind") if isinstance(drafter, dict) else None
    spec = DRAFTERS.get(kind) if isinstance(kind, str) else None
    return {"target": TargetSpec, "train": TrainSection, "data": DataConfig,
            "drafter": spec.config_cls if spec else None}
