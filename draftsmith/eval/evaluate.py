"""`draftsmith eval`: every method on the same prompts in one run, then a table, JSON and plots.

Methods run one after another on each prompt turn, so they share the machine's conditions. For
MT-bench the second turn follows the first method's answer, the same context for every method.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.chat import render_chat
from draftsmith.data.prompt_files import gather_prompts
from draftsmith.decoding.proposers.draft_model import check_same_vocab
from draftsmith.errors import DraftsmithError
from draftsmith.eval.autotune import TreeBudget, autotune_tree
from draftsmith.eval.batch_sizes import Turn, run_batch_sizes
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.executor import MethodExecutor, load_drafters, training_chat_template
from draftsmith.eval.lossless import (
    GPU_GUARANTEE,
    failure_message,
    first_divergence,
    gpu_gate_settings,
    lossless_report,
    sampling_gate,
    with_logit_gap,
)
from draftsmith.eval.methods import (
    NEEDS_DRAFT,
    Method,
    make_proposer,
    method_reports,
    open_method_resources,
    tree_shape,
)
from draftsmith.eval.metrics import RunRecord, summarize_all, summarize_batch_sizes
from draftsmith.eval.prompts_fit import check_eval_prompts_fit
from draftsmith.eval.report import (
    format_batch_table,
    format_table,
    format_variant_table,
    identical_lines,
    write_batch_plot,
    write_plots,
)
from draftsmith.eval.settings import DecodeSettings
from draftsmith.eval.target_variants import TargetVariants
from draftsmith.files import write_json
from draftsmith.precision import describe_hardware, hardware_record
from draftsmith.provenance import git_commit
from draftsmith.registry import get_spec
from draftsmith.target import load_target

CALIBRATION_PROMPTS = 4  # the tree autotuner's, spread over the prompt sets


def _is_block(method: str, drafters: dict) -> bool:
    """A method decoded by a block drafter (DFlash, DSpark)."""
    method = Method.parse(method)
    return method.uses_drafter and \
        get_spec(drafters[method.label][0].kind).proposer == "block"


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


def method_order(methods: list[str], turn_index: int) -> list[str]:
    """The methods of one prompt turn, each turn starting one method later: whichever runs first
    on a new prompt meets its shapes first (a GPU loads kernels lazily), so no method, plain
    decoding included, pays that on every prompt."""
    start = turn_index % len(methods)
    return methods[start:] + methods[:start]


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
    # a best-first block tree holds k + k^2 + ... nodes, more than EAGLE-2's cap: sizes unclamped
    shape = {"depths": tuple(range(1, drafter.module.proposals + 1)), "draft_per_step": True,
             "chain": tree_shape(method, drafter.kind) == "chain", "topk": None} if block else \
        {"topk": cfg.settings.tree.topk}
    try:
        budget = autotune_tree(runner.target_runner(model, hidden), make, calibration,
                               sampling=cfg.sampling, **shape)
    except ValueError as err:
        raise DraftsmithError(f"--tree-total-tokens auto for {method}: {err}") from None
    budget.calibration_prompts = [f"{p.set_name}/{p.item_id}" for p in chosen]
    best = f"{budget.depth},{budget.total_tokens}"
    drafting = f"{budget.draft_seconds_per_step * 1e3:.1f} ms per block" if block else \
        f"{budget.draft_seconds_per_depth * 1e3:.1f} ms/depth"
    log(f"{'block' if block else 'tree'} for {method}: depth {budget.depth}, "
        f"{budget.total_tokens} tokens (expected tau {budget.expected_tau[best]:.2f}, drafting "
        f"{drafting}, verify "
        f"{budget.verify_seconds[budget.total_tokens + 1] * 1e3:.0f} ms vs "
        f"{budget.verify_seconds[1] * 1e3:.0f} ms for one token)")
    return budget, settings(budget.depth, budget.total_tokens)


def run_eval(config: EvalConfig, log=print) -> dict:
    """Run the evaluation; write eval.json and the plots under `config.out_dir`; return the payload.

    Raises:
        DraftsmithError: among others, a prompt that cannot fit the target's context with the new
            tokens and drafts (checked before any weights load).
    """
    check_eval_prompts_fit(config)
    if config.check_lossless:  # before the first GEMM: cuBLAS reads its workspace setting once
        gpu_gate_settings(config.device)
    prompts = gather_prompts(config.bench, config.prompt_files, config.limit)
    target = load_target(config.target, dtype=config.dtype, device=config.device,
                         trust_remote_code=config.trust_remote_code)
    draft_model = None
    if any(m in NEEDS_DRAFT for m in config.methods):
        draft_model = load_target(config.draft_model, dtype=config.dtype, device=config.device,
                                  trust_remote_code=config.trust_remote_code).model
        check_same_vocab(target.model, draft_model)
    drafters = load_drafters(config, target, log)
    check_block_length(config, drafters)
    tokenizer = target.tokenizer
    open_method_resources(config.methods, config.settings, tokenizer, log)
    runner = MethodExecutor(config, target, draft_model, drafters)
    runner.chat_template = training_chat_template(drafters, log)
    tree_budgets = {}
    if config.autotune_tree:
        for method in config.methods:
            if _autotuned(method, drafters):
                tree_budgets[method], runner.settings[method] = _autotune(runner, method,
                                                                          prompts, log)

    warm = render_chat(tokenizer, [{"role": "user", "content": "Say hello."}], runner.chat_template)
    # first calls pay one-time costs (a GPU loads kernels lazily, per shape class): each method
    # runs the short prompt and the shortest and longest first turns before any timing
    firsts = sorted((render_chat(tokenizer, [{"role": "user", "content": p.turns[0]}],
                                 runner.chat_template) for p in prompts), key=len)
    extremes = [firsts[0], firsts[-1]] if firsts and firsts[-1] != firsts[0] else firsts[:1]
    for method in config.methods:
        runner.run(method, warm, 8)
        for ids in extremes:
            runner.run(method, ids, 16)
    variants = TargetVariants(runner, log)  # quantized copies of the target (--target-quant)
    variants.warm(warm)

    records: list[RunRecord] = []
    identical = {m: [0, 0] for m in config.methods[1:]}
    divergent: dict[str, dict] = {}  # method -> its first divergence from plain decoding
    turns: list[Turn] = []  # every prompt turn with plain's answer (batch sizes, sampling gate)
    total = sum(len(p.turns) for p in prompts) * len(config.methods) * (1 + len(variants))
    with tqdm(total=total, desc="eval", unit="run") as progress:
        for item in prompts:
            messages: list[dict] = []
            for turn, text in enumerate(item.turns):
                messages.append({"role": "user", "content": text})
                prompt_ids = render_chat(tokenizer, messages, runner.chat_template)
                outputs = {}
                for method in method_order(config.methods, len(turns)):
                    progress.set_postfix_str(f"{item.set_name}/{item.item_id} {method}")
                    outputs[method], record = runner.run(method, prompt_ids,
                                                         config.max_new_tokens, item.set_name,
                                                         item.item_id, turn)
                    records.append(record)
                    progress.update()
                reference = outputs[config.methods[0]]
                for method in config.methods[1:]:
                    tokens = outputs[method]
                    identical[method][0] += tokens == reference
                    identical[method][1] += 1
                    if tokens != reference and method not in divergent:
                        divergent[method] = with_logit_gap(first_divergence(
                            tokenizer, reference, tokens, item, turn), runner, method,
                            prompt_ids, reference, tokens)
                variants.run_turn(prompt_ids, item, turn, progress)
                turns.append(Turn(item.set_name, item.item_id, turn, prompt_ids, reference))
                messages.append({"role": "assistant",
                                 "content": tokenizer.decode(reference, skip_special_tokens=True)})

    table = summarize_all(records, baseline=config.methods[0])
    for method, (same, count) in identical.items():
        for per_set in table.values():
            if method in per_set:
                per_set[method]["identical_to_plain"] = same / count if count else None
    for method, report in method_reports(config.methods, config.settings, log).items():
        table["all"][method].update(report)
    batched: dict = {}
    if len(config.batch_sizes) > 1:
        batch_records, batch_divergent, skipped = run_batch_sizes(runner, turns, warm, log)
        divergent.update(batch_divergent)
        batched = {"batch_sizes": summarize_batch_sizes(table["all"], batch_records,
                                                        config.batch_sizes, config.methods[0]),
                   "batch_skipped": skipped,
                   "batch_records": [r.to_dict() for r in batch_records]}
    if config.check_lossless and not config.sampling.greedy:
        check = sampling_gate(runner, turns, config.lossless_samples, log)
    else:
        chains = [m for m in config.methods if m not in batched["batch_skipped"]] if batched else []
        check = lossless_report(config, divergent, drafters, chains)
    variants.extend_lossless(check)
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
        "target_variants": variants.report(table),
        "lossless_check": check,
        "records": [r.to_dict() for r in records],
        **batched,
    }
    json_path = write_json(out_dir / "eval.json", payload)
    plots = write_plots(table, out_dir)
    log(format_table(table))
    if variants:
        log(format_variant_table(payload["target_variants"]))
    if batched:
        plots.append(write_batch_plot(batched["batch_sizes"], out_dir))
        log(format_batch_table(batched["batch_sizes"]))
    if not config.sampling.greedy:
        log("sampling: outputs differ from plain by design; the distribution is the target's")
    else:
        dtype = target.dtype_choice.dtype if target.dtype_choice else config.dtype
        for line in identical_lines(identical, dtype):
            log(line)
    log(f"results: {json_path}; plots: {', '.join(str(p) for p in plots)}")
    if config.check_lossless:
        if check["failures"]:
            raise DraftsmithError(f"lossless check failed: {failure_message(check)} "
                                  f"(details in {json_path})")
        log(f"lossless check passed: {', '.join(check['checked'])} " + (
            "reproduce plain greedy decoding token for token (float32)" if check["greedy"] else
            f"draw their first tokens from the target's distribution ({check['test']}, "
            f"{check['samples']} draws per prompt, false-failure odds {check['level']:g})"))
        if check["guarantee"] == GPU_GUARANTEE:
            log(f"lossless check on a GPU: {GPU_GUARANTEE}")
        for name, why in check.get("not_gated", {}).items():
            log(f"lossless check: the {name} is not gated: {why}")
    return payload
