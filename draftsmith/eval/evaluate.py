"""`draftsmith eval`: every method on the same prompts in one run, then a table, JSON and plots.

Methods run one after another on each prompt turn, so they share the machine's conditions. For
MT-bench the second turn follows the first method's answer, the same context for every method.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.decoding.proposers.draft_model import check_same_vocab
from draftsmith.errors import DraftsmithError
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
from draftsmith.eval.method_shapes import autotune_methods, check_block_length
from draftsmith.eval.methods import (
    NEEDS_DRAFT,
    Method,
    method_reports,
    open_method_resources,
)
from draftsmith.eval.metrics import RunRecord, summarize_all, summarize_batch_sizes
from draftsmith.eval.prompts.files import gather_prompts
from draftsmith.eval.prompts_fit import check_eval_prompts_fit
from draftsmith.eval.report import (
    format_batch_table,
    format_table,
    format_variant_table,
    identical_lines,
    write_batch_plot,
    write_plots,
)
from draftsmith.eval.results import EvalResults, write_eval_results
from draftsmith.eval.target_variants import TargetVariants
from draftsmith.provenance import git_commit
from draftsmith.target.chat import render_chat
from draftsmith.target.load import load_target
from draftsmith.target.precision import describe_hardware, hardware_record


def method_order(methods: list[str], turn_index: int) -> list[str]:
    """The methods of one prompt turn, each turn starting one method later: whichever runs first
    on a new prompt meets its shapes first (a GPU loads kernels lazily), so no method, plain
    decoding included, pays that on every prompt."""
    start = turn_index % len(methods)
    return methods[start:] + methods[:start]


@dataclass
class Decoded:
    """What decoding every prompt turn with every method gave: one record per run, how many
    turns each method's output equalled plain decoding's (same, count), each method's first
    divergence from it, and every turn with plain's answer (batch sizes, sampling gate)."""

    records: list[RunRecord] = field(default_factory=list)
    identical: dict[str, list[int]] = field(default_factory=dict)
    divergent: dict[str, dict] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)


def run_eval(config: EvalConfig, log=print) -> dict:
    """Run the evaluation; write eval.json (`EvalResults`) and the plots under `config.out_dir`;
    return what eval.json holds.

    Raises:
        DraftsmithError: among others, a prompt that cannot fit the target's context with the new
            tokens and drafts (checked before any weights load), or a failed lossless check.
    """
    check_eval_prompts_fit(config)
    if config.check_lossless:  # before the first GEMM: cuBLAS reads its workspace setting once
        gpu_gate_settings(config.device)
    prompts = gather_prompts(config.bench, config.prompt_files, config.limit)
    runner = _runner(config, log)
    tree_budgets = autotune_methods(runner, prompts, log)
    warm = _warm_up(runner, prompts)
    variants = TargetVariants(runner, log)  # quantized copies of the target (--target-quant)
    variants.warm(warm)
    decoded = _decode_every_turn(runner, variants, prompts)
    table = _summary(config, decoded, log)
    batched = _batch_sizes(runner, decoded, table, warm, log)
    if config.check_lossless and not config.sampling.greedy:
        check = sampling_gate(runner, decoded.turns, config.lossless_samples, log)
    else:
        chains = [m for m in config.methods if m not in batched["batch_skipped"]] if batched else []
        check = lossless_report(config, decoded.divergent, runner.drafters, chains)
    variants.extend_lossless(check)
    results = _results(runner, tree_budgets, table, variants.report(table), check, decoded,
                       batched)
    json_path = write_eval_results(Path(config.out_dir) / "eval.json", results)
    _report(runner, results, decoded, json_path, log)
    return results.to_dict()


def _runner(config: EvalConfig, log) -> MethodExecutor:
    """The target, the classic draft model and the trained drafters loaded, each method's
    resources opened, as one executor."""
    target = load_target(config.target, dtype=config.dtype, device=config.device,
                         trust_remote_code=config.trust_remote_code)
    draft_model = None
    if any(m in NEEDS_DRAFT for m in config.methods):
        draft_model = load_target(config.draft_model, dtype=config.dtype, device=config.device,
                                  trust_remote_code=config.trust_remote_code).model
        check_same_vocab(target.model, draft_model)
    drafters = load_drafters(config, target, log)
    check_block_length(config, drafters)
    open_method_resources(config.methods, config.settings, target.tokenizer, log)
    runner = MethodExecutor(config, target, draft_model, drafters)
    runner.chat_template = training_chat_template(drafters, log)
    return runner


def _warm_up(runner: MethodExecutor, prompts) -> list[int]:
    """First calls pay one-time costs (a GPU loads kernels lazily, per shape class): each method
    runs a short prompt and the shortest and longest first turns before any timing. Returns the
    short prompt's ids."""
    tokenizer = runner.target.tokenizer
    warm = render_chat(tokenizer, [{"role": "user", "content": "Say hello."}], runner.chat_template)
    firsts = sorted((render_chat(tokenizer, [{"role": "user", "content": p.turns[0]}],
                                 runner.chat_template) for p in prompts), key=len)
    extremes = [firsts[0], firsts[-1]] if firsts and firsts[-1] != firsts[0] else firsts[:1]
    for method in runner.config.methods:
        runner.run(method, warm, 8)
        for ids in extremes:
            runner.run(method, ids, 16)
    return warm


def _decode_every_turn(runner: MethodExecutor, variants: TargetVariants, prompts) -> Decoded:
    """Every prompt turn with every method (the order rotating per turn), each compared with
    plain decoding; MT-bench's second turn follows plain's answer to the first."""
    config, tokenizer = runner.config, runner.target.tokenizer
    decoded = Decoded(identical={m: [0, 0] for m in config.methods[1:]})
    total = sum(len(p.turns) for p in prompts) * len(config.methods) * (1 + len(variants))
    with tqdm(total=total, desc="eval", unit="run") as progress:
        for item in prompts:
            messages: list[dict] = []
            for turn, text in enumerate(item.turns):
                messages.append({"role": "user", "content": text})
                prompt_ids = render_chat(tokenizer, messages, runner.chat_template)
                outputs = {}
                for method in method_order(config.methods, len(decoded.turns)):
                    progress.set_postfix_str(f"{item.set_name}/{item.item_id} {method}")
                    outputs[method], record = runner.run(method, prompt_ids,
                                                         config.max_new_tokens, item.set_name,
                                                         item.item_id, turn)
                    decoded.records.append(record)
                    progress.update()
                reference = outputs[config.methods[0]]
                _compare(runner, decoded, outputs, item, turn, prompt_ids)
                variants.run_turn(prompt_ids, item, turn, progress)
                decoded.turns.append(Turn(item.set_name, item.item_id, turn, prompt_ids,
                                          reference))
                messages.append({"role": "assistant",
                                 "content": tokenizer.decode(reference, skip_special_tokens=True)})
    return decoded


def _compare(runner: MethodExecutor, decoded: Decoded, outputs: dict, item, turn: int,
             prompt_ids: list[int]) -> None:
    """Count each method's output against plain decoding's; keep its first divergence."""
    methods, tokenizer = runner.config.methods, runner.target.tokenizer
    reference = outputs[methods[0]]
    for method in methods[1:]:
        tokens = outputs[method]
        decoded.identical[method][0] += tokens == reference
        decoded.identical[method][1] += 1
        if tokens != reference and method not in decoded.divergent:
            decoded.divergent[method] = with_logit_gap(first_divergence(
                tokenizer, reference, tokens, item, turn), runner, method, prompt_ids,
                reference, tokens)


def _summary(config: EvalConfig, decoded: Decoded, log) -> dict:
    """Per prompt set and method: the metrics, the share identical to plain, method reports."""
    table = summarize_all(decoded.records, baseline=config.methods[0])
    for method, (same, count) in decoded.identical.items():
        for per_set in table.values():
            if method in per_set:
                per_set[method]["identical_to_plain"] = same / count if count else None
    for method, report in method_reports(config.methods, config.settings, log).items():
        table["all"][method].update(report)
    return table


def _batch_sizes(runner: MethodExecutor, decoded: Decoded, table: dict, warm: list[int],
                 log) -> dict:
    """With several `--batch-size`s: every turn again at each batch size (eval/batch_sizes.py)."""
    config = runner.config
    if len(config.batch_sizes) <= 1:
        return {}
    records, divergent, skipped = run_batch_sizes(runner, decoded.turns, warm, log)
    decoded.divergent.update(divergent)
    return {"batch_sizes": summarize_batch_sizes(table["all"], records, config.batch_sizes,
                                                 config.methods[0]),
            "batch_skipped": skipped, "batch_records": [r.to_dict() for r in records]}


def _results(runner: MethodExecutor, tree_budgets: dict, table: dict, variants: dict,
             check: dict, decoded: Decoded, batched: dict) -> EvalResults:
    """eval.json: the config, the machine, the drafters, the summary and every record."""
    config = runner.config
    machine = hardware_record(config.device, runner.target.dtype_choice)
    return EvalResults(
        config=asdict(config),
        hardware=describe_hardware(machine),
        machine=machine,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=git_commit(),
        torch=torch.__version__,
        tree_budgets={m: asdict(b) for m, b in tree_budgets.items()},
        drafters={label: {"kind": d.kind, "path": path,
                          "training_steps": d.meta.get("training_steps"),
                          "lora_merged": bool(d.meta.get("lora")),
                          "target": d.meta.get("target")}
                  for label, path in config.all_drafters() if label in runner.drafters
                  for d in [runner.drafters[label][0]]},
        summary=table,
        target_variants=variants,
        lossless_check=check,
        records=[r.to_dict() for r in decoded.records],
        **batched,
    )


def _report(runner: MethodExecutor, results: EvalResults, decoded: Decoded, json_path: Path,
            log) -> None:
    """The tables, the plots and the lossless verdict (raising when it failed)."""
    config, table, check = runner.config, results.summary, results.lossless_check
    out_dir = Path(config.out_dir)
    kinds = {label: drafter.kind for label, (drafter, _) in runner.drafters.items()}
    names = {m: (p := Method.parse(m)).display_name(kinds.get(p.label)) for m in config.methods}
    plots = write_plots(table, out_dir, names)
    log(format_table(table, names))
    if results.target_variants:
        log(format_variant_table(results.target_variants))
    if results.batch_sizes:
        plots.append(write_batch_plot(results.batch_sizes, out_dir))
        log(format_batch_table(results.batch_sizes))
    if not config.sampling.greedy:
        log("sampling: outputs differ from plain by design; the distribution is the target's")
    else:
        choice = runner.target.dtype_choice
        for line in identical_lines(decoded.identical, choice.dtype if choice else config.dtype):
            log(line)
    log(f"results: {json_path}; plots: {', '.join(str(p) for p in plots)}")
    if config.check_lossless:
        _lossless_verdict(check, json_path, log)


def _lossless_verdict(check: dict, json_path: Path, log) -> None:
    """Raise on a failed lossless check; otherwise say what passed and what is not gated."""
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
