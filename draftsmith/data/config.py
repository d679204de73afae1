"""Data recipes: `DataConfig` (the `data:` section, also embedded in training recipes) and the
target it runs with (the `target:` section: `draftsmith.target.load.TargetSpec`, as in training
recipes, plus `device`), loaded from YAML with `section.key=value` overrides.

A data recipe file:

    # draftsmith data run --config recipes/data/X.yaml
    target:
      name: smollm2-135m-instruct
      dtype: auto
    data:
      source: sharegpt
      regenerate: {max_new_tokens: 512}
      cache: {kinds: [eagle3]}
      draft_vocab_size: 32000

Every value is checked when the config is built; an error names the field, the value and the fix.
Unknown keys are an error that lists the valid ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftsmith.config_values import apply_overrides, build_dataclass, read_yaml_mapping
from draftsmith.data.features import FEATURE_KINDS
from draftsmith.errors import DraftsmithError
from draftsmith.target.load import TargetSpec

FEATURE_DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3")
REGENERATE_BACKENDS = ("transformers", "openai")


def _require(ok: bool, name: str, value, fix: str) -> None:
    if not ok:
        raise DraftsmithError(f"{name} = {value!r}: {fix}")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _build(cls, values, prefix: str):
    return build_dataclass(cls, values, prefix)


@dataclass
class RegenerateConfig:
    """How the target rewrites every assistant turn (`data.regenerate`; null keeps the originals)."""

    # transformers: the target in this process (batched generate); openai: an OpenAI-compatible
    # server (vLLM, SGLang, llama.cpp, TGI) at base_url, checked to serve the target first
    backend: str = "transformers"
    # openai: the server's URL ending in /v1, a list of them (requests spread over all), or
    # `local`: draftsmith starts llama.cpp's server on the target's GGUF for the run
    base_url: str | list[str] | None = None
    model: str | None = None  # openai: the served model name (null: the only one served)
    # openai: chat sends messages (the server's template, checked against the target's);
    # completions sends the target's own rendered prompt as token ids
    endpoint: str = "chat"
    concurrency: int = 16  # openai: requests in flight at once (also the local server's slots)
    request_timeout: float = 600.0  # openai: seconds per request
    retries: int = 3  # openai: retries per request, with exponential backoff
    extra_body: dict | None = None  # openai: fields added to every request, e.g. a reasoning switch
    max_new_tokens: int = 512  # cap on each regenerated assistant turn
    temperature: float = 0.0  # 0 = greedy; > 0 samples
    top_p: float = 1.0  # nucleus sampling when temperature > 0
    seed: int = 0  # sampling seed (each shard reseeds from it, so resumed runs match)
    batch_size: int = 16  # at most this many prompts per `generate` call (left padded)
    batch_tokens: int = 16384  # and at most rows * (longest prompt + max_new_tokens) tokens
    shard_size: int = 256  # conversations per JSONL shard (the unit of resume)
    limit: int | None = None  # answer only the first N conversations again; the rest keep theirs
    # wall-clock budget, summed over runs: no new shard starts once finished shards took it, nor
    # one that would end more than half of itself past it at the latest shards' pace (decided
    # from the manifest, so a resumed run stops at the same shard); the rest keep their answers
    max_minutes: float | None = None

    def __post_init__(self):
        p = "data.regenerate"
        _require(self.backend in REGENERATE_BACKENDS, f"{p}.backend", self.backend,
                 f"choose one of: {', '.join(REGENERATE_BACKENDS)}")
        if isinstance(self.base_url, str):
            self.base_url = [self.base_url] if self.base_url != "local" else "local"
        if self.backend == "openai":
            urls = self.base_url
            _require(urls == "local" or (isinstance(urls, list) and bool(urls) and all(
                isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls)),
                f"{p}.base_url", urls, "give the server's URL ending in /v1 (e.g. "
                "http://127.0.0.1:8000/v1), a list of them, or `local` to have draftsmith start "
                "llama.cpp's server on the target's GGUF")
        _require(self.endpoint in ("chat", "completions"), f"{p}.endpoint", self.endpoint,
                 "choose chat or completions")
        _require(_positive_int(self.concurrency), f"{p}.concurrency", self.concurrency,
                 "must be a positive integer (e.g. 16)")
        _require(isinstance(self.request_timeout, (int, float)) and self.request_timeout > 0,
                 f"{p}.request_timeout", self.request_timeout, "must be > 0 seconds")
        _require(isinstance(self.retries, int) and self.retries >= 0, f"{p}.retries",
                 self.retries, "must be an integer >= 0")
        _require(self.extra_body is None or isinstance(self.extra_body, dict), f"{p}.extra_body",
                 self.extra_body, "must be a mapping of request fields, e.g. "
                 "{chat_template_kwargs: {enable_thinking: false}}")
        _require(self.limit is None or _positive_int(self.limit), f"{p}.limit", self.limit,
                 "must be a positive integer, or null to answer every conversation again")
        _require(self.max_minutes is None or self.max_minutes > 0, f"{p}.max_minutes",
                 self.max_minutes, "must be > 0 minutes, or null for no time limit")
        _require(_positive_int(self.max_new_tokens), f"{p}.max_new_tokens", self.max_new_tokens,
                 "must be a positive integer (e.g. 512)")
        _require(isinstance(self.temperature, (int, float)) and self.temperature >= 0,
                 f"{p}.temperature", self.temperature, "must be >= 0 (0 = greedy)")
        _require(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, f"{p}.top_p",
                 self.top_p, "must be in (0, 1]")
        _require(isinstance(self.seed, int), f"{p}.seed", self.seed, "must be an integer")
        _require(_positive_int(self.batch_size), f"{p}.batch_size", self.batch_size,
                 "must be a positive integer (e.g. 16)")
        _require(_positive_int(self.batch_tokens), f"{p}.batch_tokens", self.batch_tokens,
                 "must be a positive integer (e.g. 16384)")
        _require(_positive_int(self.shard_size), f"{p}.shard_size", self.shard_size,
                 "must be a positive integer (e.g. 256)")


@dataclass
class CacheConfig:
    """The offline hidden-state cache (`data.cache`; null = features are computed online)."""

    kinds: tuple[str, ...] = ("eagle3",)  # drafter kinds whose hidden states are stored
    # 0-based layer outputs stored besides the kinds' defaults (a drafter with custom layer_ids;
    # a training recipe sets it from its drafter section)
    aux_layers: tuple[int, ...] = ()
    # storage dtype of the hidden states; float8_e4m3: per-row scales, ~half of bf16's bytes,
    # dequantised to bf16 on read (benchmarks/memory/README.md: its accuracy cost)
    dtype: str = "bfloat16"
    batch_size: int = 32  # at most this many sequences per target forward
    batch_tokens: int = 8192  # and at most rows * longest sequence tokens
    shard_tokens: int = 32768  # tokens per safetensors shard (whole sequences; may exceed it)
    # wall-clock budget, as regenerate.max_minutes, and also checked between a shard's batches
    # (a shard that outlasts it is kept partial); the cache then holds the first conversations
    # only and training reads those
    max_minutes: float | None = None

    def __post_init__(self):
        p = "data.cache"
        if isinstance(self.kinds, str):
            self.kinds = (self.kinds,)
        _require(isinstance(self.kinds, (list, tuple)), f"{p}.kinds", self.kinds,
                 f"list one or more of: {', '.join(FEATURE_KINDS)}")
        self.kinds = tuple(self.kinds)
        aux = self.aux_layers
        _require(aux is None or isinstance(aux, (list, tuple)), f"{p}.aux_layers", aux,
                 "list 0-based layer ids (integers >= 0), e.g. [1, 14, 26]")
        self.aux_layers = tuple(aux or ())
        _require(all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                     for i in self.aux_layers), f"{p}.aux_layers", list(self.aux_layers),
                 "list 0-based layer ids (integers >= 0)")
        bad = [k for k in self.kinds if k not in FEATURE_KINDS]
        _require(bool(self.kinds) and not bad, f"{p}.kinds", list(self.kinds),
                 f"list one or more of: {', '.join(FEATURE_KINDS)}")
        _require(self.dtype in FEATURE_DTYPES, f"{p}.dtype", self.dtype,
                 f"choose one of: {', '.join(FEATURE_DTYPES)}")
        _require(_positive_int(self.batch_size), f"{p}.batch_size", self.batch_size,
                 "must be a positive integer (e.g. 32)")
        _require(_positive_int(self.batch_tokens), f"{p}.batch_tokens", self.batch_tokens,
                 "must be a positive integer (e.g. 8192)")
        _require(self.max_minutes is None or self.max_minutes > 0, f"{p}.max_minutes",
                 self.max_minutes, "must be > 0 minutes, or null for no time limit")
        _require(_positive_int(self.shard_tokens), f"{p}.shard_tokens", self.shard_tokens,
                 "must be a positive integer (e.g. 32768)")


@dataclass
class DatastoreConfig:
    """REST's retrieval datastore (`data.datastore`; null = not built): see data/datastore.py."""

    corpus: str | None = None  # text or JSONL file; null = the run's assistant answers
    max_tokens: int | None = None  # index at most this many corpus tokens (null = all)

    def __post_init__(self):
        _require(self.corpus is None or (isinstance(self.corpus, str) and bool(self.corpus)),
                 "data.datastore.corpus", self.corpus,
                 "name a text or JSONL file, or null for the run's assistant answers")
        _require(self.max_tokens is None or _positive_int(self.max_tokens),
                 "data.datastore.max_tokens", self.max_tokens,
                 "must be a positive integer, or null for the whole corpus")


@dataclass
class DataConfig:
    """Where conversations come from and what the pipeline makes of them (`data:`)."""

    source: str = "sharegpt"  # `sharegpt`, a .json/.jsonl file, a folder, or a Hub dataset id
    split: str = "train"  # split of a Hugging Face dataset
    limit: int | None = None  # first N clean conversations (null = all)
    max_pairs: int | None = None  # keep the first N user/assistant exchanges (null = all)
    max_length: int = 2048  # tokens per rendered conversation; longer ones are truncated
    chat_template: str | None = None  # Jinja template or .jinja path; null = the tokenizer's
    out_dir: str = "runs/data"  # regenerated/, cache/, draft_vocab.safetensors, summary.json
    regenerate: RegenerateConfig | None = field(default_factory=RegenerateConfig)
    cache: CacheConfig | None = None
    draft_vocab_size: int | None = None  # EAGLE-3 draft vocabulary Vd (null = not built)
    datastore: DatastoreConfig | None = None  # REST datastore built from the data (null = none)

    def __post_init__(self):
        if self.regenerate is not None:
            self.regenerate = _build(RegenerateConfig, self.regenerate, "data.regenerate")
        if self.cache is not None:
            self.cache = _build(CacheConfig, self.cache, "data.cache")
        if self.datastore is not None:
            self.datastore = _build(DatastoreConfig, self.datastore, "data.datastore")
        _require(isinstance(self.source, str) and bool(self.source.strip()), "data.source",
                 self.source, "name `sharegpt`, a .json/.jsonl file, a folder or a Hub dataset id")
        _require(isinstance(self.split, str) and bool(self.split), "data.split", self.split,
                 "name a dataset split such as `train`")
        _require(self.limit is None or _positive_int(self.limit), "data.limit", self.limit,
                 "must be a positive integer, or null for every conversation")
        _require(self.max_pairs is None or _positive_int(self.max_pairs), "data.max_pairs",
                 self.max_pairs, "must be a positive integer, or null to keep whole conversations")
        _require(_positive_int(self.max_length) and self.max_length >= 16, "data.max_length",
                 self.max_length, "must be an integer >= 16 (e.g. 2048)")
        _require(self.chat_template is None or isinstance(self.chat_template, str),
                 "data.chat_template", self.chat_template,
                 "must be a Jinja template string or the path of a .jinja file")
        _require(isinstance(self.out_dir, str) and bool(self.out_dir), "data.out_dir",
                 self.out_dir, "must be a folder path such as runs/data/my-run")
        _require(self.draft_vocab_size is None or _positive_int(self.draft_vocab_size),
                 "data.draft_vocab_size", self.draft_vocab_size,
                 "must be a positive integer no larger than the target vocabulary, or null")

    @classmethod
    def from_dict(cls, values: dict) -> DataConfig:
        """Build from a recipe's `data:` mapping; unknown keys are an error listing the valid ones."""
        return _build(cls, values, "data")

    def to_dict(self) -> dict:
        values = asdict(self)
        if self.cache is not None:
            values["cache"]["kinds"] = list(self.cache.kinds)
            values["cache"]["aux_layers"] = list(self.cache.aux_layers)
        return values


@dataclass
class DataRecipe:
    """A whole data recipe: the target (`target:`, see `draftsmith.target.load.TargetSpec`) and the
    `data:` section."""

    target: TargetSpec
    data: DataConfig


def data_for_drafter(data: dict, drafter: dict) -> dict:
    """A training recipe's `data:` section with the layer outputs its drafter chose (EAGLE-3
    `layer_ids`) added to the cache's `aux_layers`: the cache must hold what the drafter reads."""
    from draftsmith.registry import get_spec

    spec = get_spec(drafter.get("kind", ""))
    custom = spec.custom_aux_layers(spec.make_config(
        {k: v for k, v in drafter.items() if k != "kind"}))
    data = dict(data)
    if custom and isinstance(data.get("cache"), dict):
        data["cache"] = {**data["cache"], "aux_layers": sorted(
            {*data["cache"].get("aux_layers", ()), *custom})}
    return data


def load_data_recipe(path: str | Path, overrides: list[str] | None = None) -> DataRecipe:
    """Read and validate a data recipe, overrides applied on top of the file. A training recipe
    is one too: its `target:` and `data:` sections (the drafter's layers in the cache, the target
    on `device: auto` unless it names one); `drafter:` and `train:` are not read otherwise.

    Raises:
        DraftsmithError: a missing file, bad YAML, unknown keys or invalid values.
    """
    values = read_yaml_mapping(path, "recipe", "see recipes/data/ for examples")
    apply_overrides(values, overrides or [], {"target": TargetSpec, "data": DataConfig})
    training = {"drafter", "train"} & set(values)
    unknown = sorted(set(values) - {"target", "data", "drafter", "train"})
    if unknown:
        raise DraftsmithError(f"unknown section(s) {', '.join(unknown)} in {path}; "
                              "valid sections: target, data (and a training recipe's drafter, "
                              "train)")
    data = values.get("data") or {}
    target = dict(values.get("target") or {})
    if training:
        data = data_for_drafter(data, values.get("drafter") or {})
        target.setdefault("device", "auto")
    return DataRecipe(target=_build(TargetSpec, target, "target"),
                      data=DataConfig.from_dict(data))
