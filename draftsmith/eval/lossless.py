"""The lossless gate of `draftsmith eval --check-lossless` (float32).

Greedy: every method, at every batch size, must reproduce plain decoding token for token; a
failure names the first divergent token. Sampling (temperature > 0): every method's first
`GATE_TOKENS` tokens, drawn `samples` times with different seeds on each of the first
`GATE_PROMPTS` prompt turns (the first drawn from the prefill, as plain decoding's, the second
through the first verified tree), must follow the distribution of the model it decodes with,
computed exactly from that model's logits: a chi-square test per (method, prompt) at level
`GATE_LEVEL / number of tests` (Bonferroni), so a lossless run fails the gate with probability
at most about `GATE_LEVEL` = 1e-3 (the chi-square approximation holds with every bin expected at
least 5 times; see distribution_test.py). A draw the model gives zero probability always fails.

What "token for token" rests on differs by device, and each record says which (`guarantee`). On
the CPU a row's float32 logits do not depend on how many rows the forward computes, so a
divergence is a decoding bug. On a GPU cuBLAS does not promise that: it may pick another kernel
(another reduction order) for a 1-row decode step than for an n-row verification, so two logits
within float32 rounding of each other can swap. There the gate runs with TF32 off, deterministic
algorithms and a fixed cuBLAS workspace (`gpu_gate_settings`): runs repeat exactly, the rounding
between different row counts stays, and a greedy divergence names the gap between the two logits
at the divergent token, a gap at rounding level pointing at kernel choice rather than the method.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from draftsmith.decoding.sampling import SamplingConfig, logits_to_probs
from draftsmith.decoding.tree import ancestor_mask
from draftsmith.eval.distribution_test import MIN_EXPECTED, fit_first_tokens
from draftsmith.eval.methods import Method

GATE_TOKENS = 2
GATE_PROMPTS = 2
GATE_LEVEL = 1e-3


CPU_GUARANTEE = ("float32 on the CPU: a row's logits do not depend on the number of rows computed, "
                 "so plain and speculative decoding must agree token for token")
GPU_GUARANTEE = ("float32 on a GPU with TF32 off, deterministic algorithms and a fixed cuBLAS "
                 "workspace: runs repeat exactly, but cuBLAS does not promise a row's result is "
                 "independent of the number of rows (kernel choice), so a divergence between "
                 "logits within float32 rounding (see `logit_gap`) can come from the GEMMs, not "
                 "the method; rerun with --device cpu to tell them apart")


def gpu_gate_settings(device: str | torch.device) -> str:
    """Set what makes the float32 gate reproducible on a CUDA device, before its first GEMM:
    TF32 off for matmuls and convolutions, `torch.use_deterministic_algorithms` (warning where an
    op has no deterministic kernel) and `CUBLAS_WORKSPACE_CONFIG=:4096:8` unless already set.
    Returns the guarantee the gate then gives on `device` (nothing is set on a CPU)."""
    if torch.device(device).type != "cuda":
        return CPU_GUARANTEE
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    return GPU_GUARANTEE


def first_divergence(tokenizer, reference: list[int], tokens: list[int], item, turn: int) -> dict:
    """Where a method's tokens first leave plain decoding's, with a few tokens of each as text.

    `item`: anything with `set_name` and `item_id` (a prompt set item, a batch-size turn)."""
    index = next((i for i, (a, b) in enumerate(zip(reference, tokens, strict=False)) if a != b),
                 min(len(reference), len(tokens)))
    return {"set": item.set_name, "item": item.item_id, "turn": turn, "index": index,
            "plain": tokenizer.decode(reference[index:index + 4]),
            "got": tokenizer.decode(tokens[index:index + 4])}


def with_logit_gap(divergence: dict, executor, method: str, prompt_ids: list[int],
                   reference: list[int], tokens: list[int]) -> dict:
    """`divergence` with the target's `logit_gap` at it (when both runs have a token there)."""
    index = divergence["index"]
    if index < min(len(reference), len(tokens)):
        runner = executor.target_runner(executor.decoding_model(method), False)
        divergence["logit_gap"] = logit_gap(runner, prompt_ids, reference, index, tokens[index])
    return divergence


def lossless_report(config, divergent: dict, drafters: dict, batched_methods=()) -> dict:
    """Which methods were compared with plain greedy decoding and the first divergence of each.

    Args:
        config: the run's EvalConfig.
        divergent: method (or "METHOD (batch B)") -> its first divergence.
        drafters: label -> (LoadedDrafter, model).
        batched_methods: the methods that ran at every batch size above 1.

    Medusa-2 methods decode with a merged copy of the target (their output is that model's by
    design) and sampling runs differ by design; neither counts as a failure."""
    merged = {label for label, (d, _) in drafters.items() if d.meta.get("lora")}

    def exempt(method: str) -> bool:
        method = Method.parse(method)
        return method.uses_drafter and method.label in merged

    greedy = config.sampling.greedy
    checked = [m for m in config.methods[1:] if greedy and not exempt(m)]
    checked += [f"{m} (batch {b})" for b in config.batch_sizes if b > 1
                for m in batched_methods if greedy and not exempt(m)]
    return {"greedy": greedy, "dtype_exact": config.dtype == "float32",
            "guarantee": device_guarantee(config.device), "checked": checked,
            "failures": [{"method": m, **divergent[m]} for m in checked if m in divergent]}


def device_guarantee(device: str | torch.device) -> str:
    """What the float32 gate's token-for-token equality rests on, on `device`."""
    return GPU_GUARANTEE if torch.device(device).type == "cuda" else CPU_GUARANTEE


def logit_gap(runner, prompt_ids: list[int], reference: list[int], index: int,
              got: int) -> float:
    """The target's logit of plain decoding's token minus that of the divergent token, after
    the prompt and plain's first `index` tokens (one forward; `runner`: the target's
    CausalLMRunner, reset here). Near 0 (float32 rounding, ~1e-5 of the logits' size): a tie
    that another kernel may round the other way; larger: the method chose otherwise."""
    runner.reset()
    ids = torch.tensor(prompt_ids + reference[:index], device=runner.device)
    logits = runner.forward(ids).logits[-1].float()
    runner.reset()
    return float(logits[reference[index]] - logits[got])


def exact_first_tokens(runner, prompt_ids: list[int], sampling: SamplingConfig,
                       candidates: int) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The model's distribution of the first token after the prompt (from the prompt's prefill,
    where the decoding loop takes it), and of the second after each of the `candidates`
    likeliest first tokens (one tree forward: the candidates as siblings after the prompt).

    Args:
        runner: a CausalLMRunner of the model (reset here).
        prompt_ids: the prompt.
        sampling: temperature / top-p the distributions are taken under.
        candidates: how many first tokens get their second-token distribution.

    Returns:
        (p1 (V,), {x1: p2 (V,)}).
    """
    runner.reset()
    device = runner.device
    prefill = runner.forward(torch.tensor(prompt_ids, device=device), logits_to_keep=1)
    p1 = logits_to_probs(prefill.logits[-1], sampling).cpu()
    runner.commit()
    top = p1.topk(min(candidates, p1.numel())).indices.to(device)
    parents = torch.full((top.numel(),), -1, device=device)
    depths = torch.zeros(top.numel(), dtype=torch.long, device=device)
    out = runner.forward(top, runner.length + depths, ancestor_mask(parents, depths))
    p2 = logits_to_probs(out.logits, sampling).cpu()
    return p1, {int(x): p2[i] for i, x in enumerate(top.tolist())}


def sampling_gate(executor, turns: list, samples: int, log=print) -> dict:
    """The sampling gate over the first prompt turns (see the module docstring).

    Args:
        executor: the run's MethodExecutor.
        turns: the run's prompt turns (`set_name`, `item_id`, `turn`, `prompt_ids`).
        samples: draws per (method, prompt).
        log: where progress goes.

    Returns:
        The `lossless_check` record: settings, every test's result and the failures.
    """
    config = executor.config
    chosen = turns[:GATE_PROMPTS]
    level = GATE_LEVEL / max(len(chosen) * len(config.methods), 1)
    eos = set(executor.eos)
    results = []
    for turn in chosen:
        for method in config.methods:
            log(f"sampling gate: {method} on {turn.set_name}/{turn.item_id}, {samples} draws")
            # seeds two apart: a draft model's own generator takes seed + 1 (methods.py)
            draws = [tuple(executor.run(method, turn.prompt_ids, GATE_TOKENS + 1, sampling=replace(
                config.sampling, seed=config.sampling.seed + 2 * i))[0][:GATE_TOKENS])
                for i in range(samples)]
            p1, p2 = exact_first_tokens(executor.target_runner(executor.decoding_model(method),
                                                               False),
                                        turn.prompt_ids, config.sampling,
                                        int(samples / MIN_EXPECTED))
            fit = fit_first_tokens(draws, p1, p2, eos)
            results.append({"method": method, "set": turn.set_name, "item": turn.item_id,
                            "turn": turn.turn, "statistic": fit.statistic, "dof": fit.dof,
                            "p_value": fit.p_value, "impossible": fit.impossible,
                            "passed": fit.passed(level)})
    return {"greedy": False, "dtype_exact": config.dtype == "float32",
            "guarantee": device_guarantee(config.device), "test": f"chi-square of the first {GATE_TOKENS} tokens against the model's exact "
                    "distribution", "samples": samples, "level": GATE_LEVEL,
            "level_per_test": level, "checked": list(config.methods), "results": results,
            "failures": [r for r in results if not r["passed"]]}


def failure_message(check: dict) -> str:
    """One line naming every failure of a `lossless_check` record."""
    if check["greedy"]:
        gpu = check.get("guarantee") == GPU_GUARANTEE
        return "; ".join(
            f"{f['method']} diverged from plain decoding on {f['set']}/{f['item']} turn "
            f"{f['turn']} at new token {f['index']} (plain {f['plain']!r}, got {f['got']!r}"
            + (f", target logit gap {f['logit_gap']:.3g}" if "logit_gap" in f else "") + ")"
            for f in check["failures"]) + (
            " (on a GPU cuBLAS may round a near-tie differently for another number of rows; "
            "a gap near 0 points at kernel choice: rerun with --device cpu)" if gpu else "")
    return "; ".join(
        f"{f['method']} on {f['set']}/{f['item']}: its first {GATE_TOKENS} tokens do not follow "
        f"the target's distribution (chi-square p = {f['p_value']:.2g} < "
        f"{check['level_per_test']:.2g}" + (f", {f['impossible']} draws of zero probability"
                                            if f["impossible"] else "") + ")"
        for f in check["failures"])
