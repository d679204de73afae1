"""Prompts that do not fit the target's context are refused before the evaluation loads a model.

A prompt turn, its `max_new_tokens` answer and the longest draft a verify forward appends must fit
the target's context length (`max_position_embeddings`). Past it a model decodes from positions
it never saw: the output is garbage and its timings are not the model's, and targets with learned
positions crash inside torch. vLLM and OpenAI's API refuse such a request with the numbers, and so
does `draftsmith eval`: once per run, per prompt set the count of such prompts and the longest,
with the `--max-new-tokens` that would fit the others. Neither truncation (it changes the question
every method is timed on) nor skipping (it changes the set behind the reported means) is done
quietly on the user's behalf. An MT-bench item's later turns count every earlier turn with a full
`max_new_tokens` answer, the most the conversation can hold when that turn starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.eval.autotune import CALIBRATION_TREE
from draftsmith.eval.prompts.sets import BenchPrompt
from draftsmith.eval.settings import DecodeSettings
from draftsmith.target.chat import render_chat

AUTOTUNE_LARGEST_TREE = CALIBRATION_TREE  # the largest tree `--tree-total-tokens auto` drafts
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_length(config) -> int | None:
    """The target's context length from its transformers config (its text part for multimodal
    models); None when the config names none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in POSITION_KEYS:
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def draft_margin(settings: DecodeSettings, autotune_tree: bool = False) -> int:
    """Positions a verify forward may append past the committed tokens: the longest draft of any
    method's settings, plus the bonus token."""
    lookahead = (settings.lookahead_window + settings.lookahead_guesses) * \
        (settings.lookahead_ngram - 1)
    tree = AUTOTUNE_LARGEST_TREE if autotune_tree else settings.tree.total_tokens
    return 1 + max(settings.num_draft_tokens, settings.lookup_tokens, tree,
                   settings.rest_tokens, lookahead)


def conversation_tokens(tokenizer, prompt: BenchPrompt, template: str | None = None) -> int:
    """Tokens of an item's last turn before any answer text: every user turn, with the earlier
    answers empty in the chat template (each answer adds at most `max_new_tokens` to this)."""
    messages: list[dict] = []
    for turn, text in enumerate(prompt.turns):
        if turn:
            messages.append({"role": "assistant", "content": ""})
        messages.append({"role": "user", "content": text})
    return len(render_chat(tokenizer, messages, template))


def check_prompts_fit(tokenizer, prompts: Sequence[BenchPrompt], context: int | None,
                      max_new_tokens: int, margin: int, template: str | None = None,
                      setting: str = "--max-new-tokens") -> None:
    """Refuse when any prompt with its answers and draft does not fit `context` tokens
    (`setting`: what the user sets max_new_tokens with, for the message).

    Raises:
        DraftsmithError: one message: per prompt set the count and the longest item, the
            context, and the fixes (a `--max-new-tokens` that fits every prompt when one does,
            fewer items, another target).
    """
    if not context:
        return
    rows = [(p.set_name, p.item_id, conversation_tokens(tokenizer, p, template) + margin,
             len(p.turns)) for p in prompts]  # (set, id, tokens without the answers, turns)
    over: dict[str, list[tuple[int, str]]] = {}
    for name, item, base, turns in rows:
        if base + max_new_tokens * turns > context:
            over.setdefault(name, []).append((base + max_new_tokens * turns, item))
    if not over:
        return
    sizes = {name: sum(row[0] == name for row in rows) for name in over}
    sets = "; ".join(f"{len(found)} of {sizes[name]} prompts of {name} (longest: {item}, "
                     f"{need} tokens)" for name, found in over.items()
                     for need, item in [max(found)])
    fits = min((context - base) // turns for _, _, base, turns in rows)
    fix = (f"set {setting} {fits} or less" if fits >= 1 else
           "remove the prompts that are too long even without an answer")
    raise DraftsmithError(
        f"prompts longer than the target's context of {context} tokens (prompt + "
        f"{setting} {max_new_tokens} per turn + {margin} draft tokens): {sets}. Past its "
        f"context a model decodes garbage, so they are not evaluated; {fix}, use fewer prompts "
        "(--limit, or edit the prompt file), or a target with a longer context")


def drafters_chat_template(folders: Sequence[str]) -> str | None:
    """The custom chat template recorded in the drafters' `draftsmith_drafter.json` (None: the
    tokenizer's own), as the evaluation renders prompts with it."""
    from draftsmith.drafter_folder import DRAFTER_CONFIG
    from draftsmith.files import read_json_dict

    templates = [read_json_dict(Path(folder) / DRAFTER_CONFIG).get("chat_template")
                 for folder in folders]
    return next((t for t in templates if isinstance(t, str)), None)


def target_context_length(spec: str, trust_remote_code: bool = False) -> int | None:
    """`context_length` of a target spec, from its config alone (no weights).

    Raises:
        DraftsmithError: a missing or corrupted target, or an unreadable config.
    """
    from transformers import AutoConfig

    from draftsmith.target.source import resolve_source

    source, kwargs = resolve_source(spec)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as err:
        raise DraftsmithError(f"could not read the config of target {spec!r}: {err}") from err
    return context_length(config)


def check_eval_prompts_fit(config) -> None:
    """`check_prompts_fit` for an `EvalConfig`, reading only the target's config and tokenizer
    and the prompt sets (no weights): call it before `run_eval`.

    Raises:
        DraftsmithError: prompts that do not fit (see `check_prompts_fit`), or an unloadable
            target config or tokenizer.
    """
    from draftsmith.eval.prompts.files import gather_prompts
    from draftsmith.target.load import load_tokenizer

    context = target_context_length(config.target, config.trust_remote_code)
    if not context:
        return
    prompts = gather_prompts(config.bench, config.prompt_files, config.limit)
    tokenizer = load_tokenizer(config.target, trust_remote_code=config.trust_remote_code)
    template = drafters_chat_template([folder for _, folder in config.all_drafters()])
    check_prompts_fit(tokenizer, prompts, context, config.max_new_tokens,
                      draft_margin(config.settings, config.autotune_tree), template)
