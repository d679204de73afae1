"""Running one decoding method on one prompt (draftsmith's loop or a Hugging Face baseline), and
loading the trained drafters a run's methods decode with."""

from __future__ import annotations

import copy

from draftsmith.drafter_folder import merge_lora
from draftsmith.errors import DraftsmithError
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.decode import generate
from draftsmith.eval.hf_baselines import HF_METHODS, hf_generate
from draftsmith.eval.methods import NEEDS_DRAFTER, ProposerSettings, make_proposer, split_method
from draftsmith.eval.metrics import RunRecord
from draftsmith.eval.runner import CausalLMRunner
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
        self.settings: dict[str, ProposerSettings] = {}  # per-method (autotuned trees)
        self.runners: dict[tuple[int, bool], CausalLMRunner] = {}
        self.eos = target.eos_token_ids
        self.chat_template: str | None = None  # the drafters' training template, if custom

    def target_runner(self, model, hidden: bool) -> CausalLMRunner:
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
        runner = self.target_runner(model, getattr(proposer, "needs_hidden_states", False))
        result = generate(runner, proposer, prompt_ids, max_new_tokens, self.eos, cfg.sampling)
        return result.tokens, RunRecord(
            method, set_name, item_id, turn, len(result.tokens), result.total_seconds,
            result.prefill_seconds, result.draft_seconds, result.verify_seconds,
            result.accepted_per_step, result.depth_per_step, result.tokens_per_step,
            result.step_seconds)


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
