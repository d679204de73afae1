"""`draftsmith eval`: every method on the same prompts in one run, then a table, JSON and plots.

Methods run one after another on each prompt turn, so they share the machine's conditions. For
MT-bench the second turn follows the first method's answer, the same context for every method.
"""

from __future__ import annotations

import copy
import datetime
import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.chat import render_chat
from draftsmith.data.prompts import load_prompts
from draftsmith.errors import DraftsmithError
from draftsmith.eval.autotune import TreeBudget, autotune_tree
from draftsmith.eval.decode import generate
from draftsmith.eval.hf_baselines import HF_METHODS, hf_generate
from draftsmith.eval.methods import (
    DEFAULT_TREE,
    NEEDS_DRAFT,
    NEEDS_DRAFTER,
    ProposerSettings,
    check_methods,
    make_proposer,
    split_method,
)
from draftsmith.eval.metrics import RunRecord, summarize_all
from draftsmith.eval.proposers.draft_model import check_same_vocab
from draftsmith.eval.report import format_table, write_json, write_plots
from draftsmith.eval.runner import CausalLMRunner
from draftsmith.eval.sampling import SamplingConfig
from draftsmith.export.importer import load_any_drafter
from draftsmith.models.loading import merge_lora
from draftsmith.offline_models import DEFAULT_TARGET
from draftsmith.precision import describe_hardware, hardware_record
from draftsmith.target import load_target


@dataclass
class EvalConfig:
    """What `draftsmith eval` runs.

    Attributes:
        target: target spec (offline name, folder, .gguf or Hub id).
        draft_model: classic draft model spec for draft methods, or None.
        drafter: trained drafter folder for the `drafter*` methods, or None.
        drafters: (label, folder) pairs of named drafters evaluated in the same run; their methods
            are written `drafter@label`, `drafter_dynamic@label`, ... (see methods.split_method).
        dtype, device: for target and draft model (`auto`: see draftsmith.precision).
        bench: prompt sets (mt_bench, humaneval, gsm8k).
        limit: items per set.
        max_new_tokens: budget per turn.
        methods: methods in run order; the first is the speedup baseline and supplies MT-bench's
            second-turn context.
        sampling: temperature / top-p / seed (temperature 0 = greedy).
        settings: proposer knobs.
        out_dir: where eval.json and the plots go.
        trust_remote_code: passed to model loading.
        autotune_tree: measure this machine and pick each dynamic-tree method's depth and
            total_tokens (replacing `settings.tree`'s for that method).
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
    settings: ProposerSettings = field(default_factory=ProposerSettings)
    out_dir: str = "runs/eval"
    trust_remote_code: bool = False
    autotune_tree: bool = False

    def __post_init__(self):
        if self.limit < 1:
            raise DraftsmithError(f"--limit {self.limit} must be >= 1")
        if self.max_new_tokens < 1:
            raise DraftsmithError(f"--max-new-tokens {self.max_new_tokens} must be >= 1")
        if not self.methods or self.methods[0] != "plain":
            self.methods = ("plain", *[m for m in self.methods if m != "plain"])
        labels = [label for label, _ in self.drafters]
        if len(set(labels)) != len(labels) or "" in labels:
            raise DraftsmithError(f"drafter labels {labels} must be distinct and non-empty")
        check_methods(list(self.methods), self.draft_model is not None,
                      [label for label, _ in self.all_drafters()])

    def all_drafters(self) -> list[tuple[str, str]]:
        """Every drafter of the run as (label, folder); the unlabelled `drafter` has label ""."""
        return ([("", self.drafter)] if self.drafter else []) + list(self.drafters)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, timeout=5)
    except OSError:
        return None
    return out.stdout.strip() or None


class MethodRunner:
    """Runs one method on one prompt and returns its tokens and record.

    `drafters` maps a label to (LoadedDrafter, the target model it decodes with): the target
    itself, or for Medusa-2 a copy with its LoRA adapter merged in.
    """

    def __init__(self, config: EvalConfig, target, draft_model, drafters=None):
        self.config = config
        self.target = target
        self.draft_model = draft_model
        self.drafters = drafters or {}
        self.settings: dict[str, ProposerSettings] = {}  # per-method (autotuned trees)
        self.runners: dict[tuple[int, bool], CausalLMRunner] = {}
        self.eos = target.eos_token_ids

    def runner_for(self, model, hidden: bool) -> CausalLMRunner:
        key = (id(model), hidden)
        if key not in self.runners:
            self.runners[key] = CausalLMRunner(model, output_hidden_states=hidden)
        return self.runners[key]

    def run(self, method: str, prompt_ids: list[int], max_new_tokens: int,
            set_name: str = "", item_id: str = "", turn: int = 0) -> tuple[list[int], RunRecord]:
        cfg = self.config
        if method in HF_METHODS:
            tokens, seconds = hf_generate(method, self.target.model, prompt_ids, max_new_tokens,
                                          self.eos, cfg.sampling, self.draft_model,
                                          cfg.settings.lookup_tokens)
            return tokens, RunRecord(method, set_name, item_id, turn, len(tokens), seconds)
        drafter, model = self.drafters.get(split_method(method)[1], (None, self.target.model))
        settings = self.settings.get(method, cfg.settings)
        proposer = make_proposer(method, settings, cfg.sampling, self.draft_model, drafter)
        runner = self.runner_for(model, getattr(proposer, "needs_hidden_states", False))
        result = generate(runner, proposer, prompt_ids, max_new_tokens, self.eos, cfg.sampling)
        return result.tokens, RunRecord(
            method, set_name, item_id, turn, len(result.tokens), result.total_seconds,
            result.prefill_seconds, result.draft_seconds, result.verify_seconds,
            result.accepted_per_step, result.depth_per_step, result.tokens_per_step,
            result.step_seconds)


def _uses_dynamic_tree(method: str, drafters: dict) -> bool:
    base, label = split_method(method)
    if base == "draft_model_tree" or base == "drafter_dynamic":
        return True
    return base == "drafter" and DEFAULT_TREE[drafters[label][0].kind] == "dynamic"


def _autotune(runner: MethodRunner, method: str, prompts, log) -> TreeBudget:
    """Pick depth and total_tokens of one dynamic-tree method on this machine (autotune.py)."""
    cfg = runner.config
    calibration = [render_chat(runner.target.tokenizer, [{"role": "user", "content": p.turns[0]}])
                   for p in prompts[:2]]
    drafter, model = runner.drafters.get(split_method(method)[1], (None, runner.target.model))

    def make(depth: int, total: int):
        tree = replace(cfg.settings.tree, depth=depth, total_tokens=total)
        return make_proposer(method, replace(cfg.settings, tree=tree), cfg.sampling,
                             runner.draft_model, drafter)

    hidden = getattr(make(1, 1), "needs_hidden_states", False)
    budget = autotune_tree(runner.runner_for(model, hidden), make, calibration)
    best = f"{budget.depth},{budget.total_tokens}"
    log(f"tree for {method}: depth {budget.depth}, {budget.total_tokens} tokens "
        f"(expected tau {budget.expected_tau[best]:.2f}, drafting "
        f"{budget.draft_seconds_per_depth * 1e3:.1f} ms/depth, verify "
        f"{budget.verify_seconds[budget.total_tokens + 1] * 1e3:.0f} ms vs "
        f"{budget.verify_seconds[1] * 1e3:.0f} ms for one token)")
    return budget


def load_drafters(config: EvalConfig, target, log) -> dict:
    """label -> (LoadedDrafter, target model it decodes with) for the drafters the methods use.

    A Medusa-2 drafter trained the target's LoRA adapter: it decodes with a copy of the target
    with the adapter merged in (the original target stays as it is for every other method).
    """
    used = {split_method(m)[1] for m in config.methods if split_method(m)[0] in NEEDS_DRAFTER}
    drafters = {}
    for label, path in config.all_drafters():
        if label not in used:
            continue
        drafter = load_any_drafter(path, target.model)
        name = f"drafter {label!r}" if label else "drafter"
        log(f"{name}: {drafter.kind} from {path} "
            f"({drafter.meta.get('training_steps', '?')} training steps)")
        model = target.model
        if drafter.meta.get("lora"):
            model = merge_lora(copy.deepcopy(target.model), path)
            log(f"{name} is Medusa-2: it decodes with a copy of the target with its LoRA adapter "
                "merged in (its output is that model's, not the original target's)")
        drafters[label] = (drafter, model)
    return drafters


def run_eval(config: EvalConfig, log=print) -> dict:
    """Run the evaluation; write eval.json and the plots under `config.out_dir`; return the payload."""
    prompts = [p for name in config.bench for p in load_prompts(name, config.limit)]
    target = load_target(config.target, dtype=config.dtype, device=config.device,
                         trust_remote_code=config.trust_remote_code)
    draft_model = None
    if any(m in NEEDS_DRAFT for m in config.methods):
        draft_model = load_target(config.draft_model, dtype=config.dtype, device=config.device,
                                  trust_remote_code=config.trust_remote_code).model
        check_same_vocab(target.model, draft_model)
    drafters = load_drafters(config, target, log)
    tokenizer = target.tokenizer
    runner = MethodRunner(config, target, draft_model, drafters)
    tree_budgets = {}
    if config.autotune_tree:
        for method in config.methods:
            if _uses_dynamic_tree(method, drafters):
                tree_budgets[method] = _autotune(runner, method, prompts, log)
                runner.settings[method] = replace(config.settings, tree=replace(
                    config.settings.tree, depth=tree_budgets[method].depth,
                    total_tokens=tree_budgets[method].total_tokens))

    warm = render_chat(tokenizer, [{"role": "user", "content": "Say hello."}])
    for method in config.methods:  # first calls pay one-time costs; keep them out of the numbers
        runner.run(method, warm, 8)

    records: list[RunRecord] = []
    identical = {m: [0, 0] for m in config.methods[1:]}
    total = sum(len(p.turns) for p in prompts) * len(config.methods)
    with tqdm(total=total, desc="eval", unit="run") as progress:
        for item in prompts:
            messages: list[dict] = []
            for turn, text in enumerate(item.turns):
                messages.append({"role": "user", "content": text})
                prompt_ids = render_chat(tokenizer, messages)
                reference = None
                for method in config.methods:
                    progress.set_postfix_str(f"{item.set_name}/{item.item_id} {method}")
                    tokens, record = runner.run(method, prompt_ids, config.max_new_tokens,
                                                item.set_name, item.item_id, turn)
                    records.append(record)
                    if reference is None:
                        reference = tokens
                    else:
                        identical[method][0] += tokens == reference
                        identical[method][1] += 1
                    progress.update()
                messages.append({"role": "assistant",
                                 "content": tokenizer.decode(reference, skip_special_tokens=True)})

    table = summarize_all(records, baseline=config.methods[0])
    for method, (same, count) in identical.items():
        for per_set in table.values():
            if method in per_set:
                per_set[method]["identical_to_plain"] = same / count if count else None
    out_dir = Path(config.out_dir)
    machine = hardware_record(config.device, target.dtype_choice)
    payload = {
        "config": asdict(config),
        "hardware": describe_hardware(machine),
        "machine": machine,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "tree_budgets": {m: asdict(b) for m, b in tree_budgets.items()},
        "drafters": {label: {"kind": d.kind, "path": path,
                             "training_steps": d.meta.get("training_steps"),
                             "lora_merged": bool(d.meta.get("lora")),
                             "target": d.meta.get("target")}
                     for label, path in config.all_drafters() if label in drafters
                     for d in [drafters[label][0]]},
        "summary": table,
        "records": [r.to_dict() for r in records],
    }
    json_path = write_json(out_dir / "eval.json", payload)
    plots = write_plots(table, out_dir)
    log(format_table(table))
    if not config.sampling.greedy:
        log("sampling: outputs differ from plain by design; the distribution is the target's")
    else:
        log("identical to plain greedy output: " + ", ".join(
            f"{m} {s / c:.0%}" for m, (s, c) in identical.items() if c))
    log(f"results: {json_path}; plots: {', '.join(str(p) for p in plots)}")
    return payload
