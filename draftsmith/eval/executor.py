"""Running one decoding method on one prompt (draftsmith's loop or a Hugging Face baseline), and
loading the trained drafters a run's methods decode with."""

from __future__ import annotations

import copy

from draftsmith.decoding.batched import BatchResult, generate_batch
from draftsmith.decoding.batched_runner import BatchedLMRunner
from draftsmith.decoding.decode import generate
from draftsmith.decoding.proposers.base import Proposer
from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.decoding.sampling import SamplingConfig
from draftsmith.drafter_folder import merge_lora
from draftsmith.errors import DraftsmithError
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.hf_baselines import HF_METHODS, hf_generate
from draftsmith.eval.methods import Method, make_proposer
from draftsmith.eval.metrics import RunRecord
from draftsmith.eval.settings import DecodeSettings
from draftsmith.export.load import load_any_drafter


class MethodExecutor:
    """Runs one method on one prompt and returns its tokens and record.

    `drafters` maps a label to (LoadedDrafter, the target model it decodes with): the target
    itself, or for Medusa-2 a copy with its LoRA adapter merged in.
    """

    def __init__(self, config: EvalConfig, target, draft_model, drafters=None):
        self.config = config
        self.target = target
        self.draft_model = draft_model
        self.drafters = drafters or {}
        self.settings: dict[str, DecodeSettings] = {}  # per-method (autotuned trees)
        self.runners: dict[tuple[int, bool], CausalLMRunner] = {}
        self.batched_runners: dict[tuple[int, bool], BatchedLMRunner] = {}
        pad = getattr(target.tokenizer, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else (self.eos or [0])[0]
        self.eos = target.eos_token_ids
        self.chat_template: str | None = None  # the drafters' training template, if custom

    def target_runner(self, model, hidden: bool) -> CausalLMRunner:
        key = (id(model), hidden)
        if key not in self.runners:
            self.runners[key] = CausalLMRunner(model, output_hidden_states=hidden)
        return self.runners[key]

    def decoding_model(self, method: str):
        """The model a method decodes with: the target, or a Medusa-2 drafter's merged copy."""
        return self.drafters.get(Method.parse(method).label, (None, self.target.model))[1]

    def _proposer(self, method: str, sampling: SamplingConfig) -> Proposer:
        drafter = self.drafters.get(Method.parse(method).label, (None, None))[0]
        return make_proposer(method, self.settings.get(method, self.config.settings), sampling,
                             self.draft_model, drafter)

    def run(self, method: str, prompt_ids: list[int], max_new_tokens: int,
            set_name: str = "", item_id: str = "", turn: int = 0,
            sampling: SamplingConfig | None = None) -> tuple[list[int], RunRecord]:
        """One method on one prompt; `sampling` replaces the run's (the sampling gate's seeds)."""
        cfg = self.config
        sampling = sampling or cfg.sampling
        if method in HF_METHODS:
            tokens, seconds = hf_generate(method, self.target.model, prompt_ids, max_new_tokens,
                                          self.eos, sampling, self.draft_model,
                                          cfg.settings.lookup_tokens)
            return tokens, RunRecord(method, set_name, item_id, turn, len(tokens), seconds)
        proposer = self._proposer(method, sampling)
        runner = self.target_runner(self.decoding_model(method),
                                    proposer.needs_hidden_states)
        result = generate(runner, proposer, prompt_ids, max_new_tokens, self.eos, sampling)
        return result.tokens, RunRecord(
            method, set_name, item_id, turn, len(result.tokens), result.total_seconds,
            result.prefill_seconds, result.draft_seconds, result.verify_seconds,
            result.accepted_per_step, result.depth_per_step, result.tokens_per_step,
            result.step_seconds)


    def run_batch(self, method: str, prompts: list[list[int]], max_new_tokens: int
                  ) -> BatchResult:
        """One chain method on a batch of prompts at once (see batched.py)."""
        proposers = [self._proposer(method, self.config.sampling) for _ in prompts]
        hidden = proposers[0].needs_hidden_states
        key = (id(self.decoding_model(method)), hidden)
        if key not in self.batched_runners:
            self.batched_runners[key] = BatchedLMRunner(self.decoding_model(method), hidden)
        return generate_batch(self.batched_runners[key], proposers, prompts, max_new_tokens,
                              self.eos, self.config.sampling, self.pad_token_id)


def load_drafters(config: EvalConfig, target, log) -> dict:
    """label -> (LoadedDrafter, target model it decodes with) for the drafters the methods use.

    A Medusa-2 drafter trained the target's LoRA adapter: it decodes with a copy of the target
    with the adapter merged in (the original target stays as it is for every other method).
    """
    used = {p.label for p in map(Method.parse, config.methods) if p.uses_drafter}
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


def training_chat_template(drafters: dict, log=print) -> str | None:
    """The custom chat template the run's drafters were trained with (None: the tokenizer's).

    Raises:
        DraftsmithError: drafters trained with different templates (they cannot share prompts).
    """
    templates = {d.meta.get("chat_template") for d, _ in drafters.values()} - {None}
    if len(templates) > 1:
        raise DraftsmithError("the drafters of this run were trained with different chat "
                              "templates; evaluate them in separate runs")
    if templates:
        log("prompts are rendered with the chat template the drafter was trained with")
    return next(iter(templates), None)
