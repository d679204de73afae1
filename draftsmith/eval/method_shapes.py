"""Each method's shape chosen for this run before any timing: `--tree-total-tokens auto` picks a
dynamic tree's depth and size (and a block drafter's chain length) per method on this machine
(`autotune.py`); `--block-length` is checked against the block drafters of the run."""

from __future__ import annotations

from dataclasses import replace

from draftsmith.errors import DraftsmithError
from draftsmith.eval.autotune import TreeBudget, autotune_tree
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.executor import MethodExecutor
from draftsmith.eval.methods import Method, make_proposer, tree_shape
from draftsmith.eval.settings import DecodeSettings
from draftsmith.registry import get_spec
from draftsmith.target.chat import render_chat

CALIBRATION_PROMPTS = 4  # the tree autotuner's, spread over the prompt sets


def _is_block(method: str, drafters: dict) -> bool:
    """A method decoded by a block drafter (DFlash, DSpark)."""
    method = Method.parse(method)
    return method.uses_drafter and \
        get_spec(drafters[method.label][0].kind).proposer == "block"


def _one_forward(method: str, drafters: dict) -> bool:
    """A method whose drafter drafts every depth in one forward (DFlash, DSpark, P-EAGLE)."""
    method = Method.parse(method)
    return method.uses_drafter and \
        get_spec(drafters[method.label][0].kind).drafts_in_one_forward


def check_block_length(config: EvalConfig, drafters: dict) -> None:
    """`--block-length` must not exceed what a block drafter of the run proposes per block: a
    longer one was cut to the block while eval.json recorded the length asked for.

    Raises:
        DraftsmithError: naming the flag, the drafter, its block size and the longest length.
    """
    length = config.settings.block_length
    if length is None:
        return
    for method in config.methods:
        if not _is_block(method, drafters):
            continue
        label = Method.parse(method).label
        drafter = drafters[label][0]
        most = drafter.module.proposals
        if length > most:
            name = f"drafter {label!r}" if label else "the drafter"
            raise DraftsmithError(
                f"--block-length {length} is longer than {name} proposes: a "
                f"{get_spec(drafter.kind).title} drafter with block_size "
                f"{drafter.module.block_size} proposes {most} tokens per block; use "
                f"--block-length {most} or less, or leave it out for the whole block")


def _autotuned(method: str, drafters: dict) -> bool:
    """Methods whose shape `--tree-total-tokens auto` picks: dynamic trees (depth and size) and
    block drafters' chains (their length)."""
    parsed = Method.parse(method)
    if parsed.base == "draft_model_tree":
        return True
    if not parsed.uses_drafter:
        return False
    shape = parsed.tree_shape(drafters[parsed.label][0].kind)
    return shape == "dynamic" or (shape == "chain" and _is_block(method, drafters))


def search_space(method: str, drafters: dict, topk: int) -> dict:
    """The autotuner's candidates and cost model for one method (`autotune_tree`'s keywords).

    A drafter that drafts every depth in one forward (DFlash, DSpark, P-EAGLE) costs the same at
    any depth and is tried at each depth it proposes; a block drafter's best-first tree holds
    k + k^2 + ... nodes, more than EAGLE-2's top-k cap, so its sizes are not clamped, and its
    chain is tuned by length. Other drafters pay one forward per depth under the run's top-k.
    """
    shape = {"topk": topk}
    if _one_forward(method, drafters):
        drafter = drafters[Method.parse(method).label][0]
        shape |= {"depths": tuple(range(1, drafter.module.proposals + 1)), "draft_per_step": True}
    if _is_block(method, drafters):
        drafter = drafters[Method.parse(method).label][0]
        shape |= {"chain": tree_shape(method, drafter.kind) == "chain", "topk": None}
    return shape


def _autotune(runner: MethodExecutor, method: str, prompts, log) -> tuple[TreeBudget,
                                                                           DecodeSettings]:
    """Pick depth and total_tokens of one dynamic-tree method on this machine (autotune.py); a
    block drafter's depth is its block length (one drafter forward whatever the length).

    Returns:
        (the autotuner's choice and curves, the method's settings with it)."""
    cfg = runner.config
    count = min(CALIBRATION_PROMPTS, len(prompts))  # spread over the sets
    chosen = [prompts[i * len(prompts) // count] for i in range(count)]
    calibration = [render_chat(runner.target.tokenizer, [{"role": "user", "content": p.turns[0]}],
                               runner.chat_template) for p in chosen]
    drafter, model = runner.drafters.get(Method.parse(method).label, (None, runner.target.model))
    block = _is_block(method, runner.drafters)

    def settings(depth: int, total: int) -> DecodeSettings:
        return replace(cfg.settings.with_tree(depth, total),
                       block_length=depth if block else cfg.settings.block_length)

    def make(depth: int, total: int):
        return make_proposer(method, settings(depth, total), cfg.sampling, runner.draft_model,
                             drafter)

    hidden = make(1, 1).needs_hidden_states
    shape = search_space(method, runner.drafters, cfg.settings.tree.topk)
    try:
        budget = autotune_tree(runner.target_runner(model, hidden), make, calibration,
                               sampling=cfg.sampling, **shape)
    except ValueError as err:
        raise DraftsmithError(f"--tree-total-tokens auto for {method}: {err}") from None
    budget.calibration_prompts = [f"{p.set_name}/{p.item_id}" for p in chosen]
    best = f"{budget.depth},{budget.total_tokens}"
    drafting = f"{budget.draft_seconds_per_step * 1e3:.1f} ms per step" \
        if shape.get("draft_per_step") else f"{budget.draft_seconds_per_depth * 1e3:.1f} ms/depth"
    log(f"{'block' if block else 'tree'} for {method}: depth {budget.depth}, "
        f"{budget.total_tokens} tokens (expected tau {budget.expected_tau[best]:.2f}, drafting "
        f"{drafting}, verify "
        f"{budget.verify_seconds[budget.total_tokens + 1] * 1e3:.0f} ms vs "
        f"{budget.verify_seconds[1] * 1e3:.0f} ms for one token)")
    return budget, settings(budget.depth, budget.total_tokens)


def autotune_methods(runner: MethodExecutor, prompts, log) -> dict[str, TreeBudget]:
    """With `--tree-total-tokens auto`: each autotuned method's choice, its settings set on the
    runner (`runner.settings[method]`); {} otherwise."""
    budgets = {}
    if runner.config.autotune_tree:
        for method in runner.config.methods:
            if _autotuned(method, runner.drafters):
                budgets[method], runner.settings[method] = _autotune(runner, method, prompts, log)
    return budgets
