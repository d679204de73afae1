"""`draftsmith eval`: its arguments, and the methods list they make (`--baselines`, `--drafter`)."""

from __future__ import annotations

import argparse

from draftsmith.config_values import add_prompt_arguments, positive_int_arg
from draftsmith.errors import DraftsmithError
from draftsmith.eval.settings import add_decode_arguments, decode_settings_from_args
from draftsmith.target.args import add_target_arguments


def add_eval_parser(verbs) -> None:
    ev = verbs.add_parser("eval", help="speculative decoding: tau, acceptance, speedup vs baselines")
    add_target_arguments(ev)
    ev.add_argument("--drafter", action="append",
                    help="trained drafter folder (from `draftsmith train` or an export); adds the "
                    "`drafter` method. Several in one run: --drafter LABEL=DIR, repeated, and "
                    "methods such as drafter@LABEL or drafter_dynamic@LABEL")
    ev.add_argument("--draft-model", help="classic draft model spec (same tokenizer as the target)")
    ev.add_argument("--methods", default="plain,prompt_lookup",
                    help="comma list: plain, prompt_lookup, lookahead, rest, draft_model, "
                    "draft_model_tree, drafter, drafter_chain, drafter_static, drafter_dynamic, "
                    "drafter_lookup, hf_generate, hf_assisted, hf_prompt_lookup")
    ev.add_argument("--baselines", action="store_true",
                    help="add prompt lookup, lookahead, HF generate / prompt lookup, with "
                    "--datastore REST, with --drafter each drafter with prompt lookup "
                    "(drafter_lookup), and with --draft-model the classic draft model and HF "
                    "assisted generation")
    add_prompt_arguments(ev, limit=5)
    ev.add_argument("--check-lossless", action="store_true",
                    help="a gate, in float32: greedy, exit non-zero naming the first divergent "
                    "token of any method (at any batch size) that does not reproduce plain "
                    "decoding; at --temperature > 0, a chi-square test of each method's first "
                    "2 tokens against the target's distribution (false-failure odds 1e-3)")
    ev.add_argument("--lossless-samples", type=positive_int_arg, default=300,
                    help="draws per method and prompt of the sampling gate (at least 50)")
    ev.add_argument("--batch-size", default="1",
                    help="comma list of batch sizes, e.g. 1,2,4,8 (1 always runs): above 1, plain "
                    "decoding and the chain methods decode batches of prompts at once, with "
                    "tokens/s and speedup per batch size (trees run at batch 1 only for now)")
    ev.add_argument("--target-quant", default="none",
                    help="target variants, e.g. none,int8wo: every method also runs against an "
                    "int8 copy of the target on the CPU, on the same prompts, each with speedup "
                    "against its own plain decoding and the acceptance drop against the target as "
                    "loaded; that copy's output is the int8 model's. int8wo: weight-only int8, "
                    "activations in the target's dtype, exact over its own decoding; int8: "
                    "torch's dynamic int8 (float32 base; a verify's rows share activation scales, "
                    "so not exact) (default: none)")
    ev.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ev.add_argument("--top-p", type=float, default=1.0)
    ev.add_argument("--seed", type=int, default=0)
    add_decode_arguments(ev)  # every decoding knob, declared once in eval/settings.py
    ev.add_argument("--out", default="runs/eval", help="folder for eval.json and plots")
    ev.set_defaults(func=cmd_eval)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _drafter_args(values: list[str]) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """`--drafter DIR` (once) or `--drafter LABEL=DIR` (any number) -> (DIR or None, pairs)."""
    single = [v for v in values if "=" not in v]
    named = tuple(tuple(v.split("=", 1)) for v in values if "=" in v)
    for value in values:
        label, sep, folder = value.rpartition("=") if "=" in value else ("", "", value)
        if not folder.strip() or (sep and not label.strip()):
            missing = "folder" if not folder.strip() else "label"
            raise DraftsmithError(f"--drafter {value!r} names no {missing}; "
                                  "write --drafter DIR, or --drafter LABEL=DIR with both parts")
    if len(single) > 1 or (single and named):
        raise DraftsmithError("give one --drafter DIR, or name each drafter: --drafter LABEL=DIR "
                              "(methods then take @LABEL, e.g. drafter_dynamic@eagle1)")
    return (single[0] if single else None), named


def cmd_eval(args: argparse.Namespace) -> int:
    from draftsmith.eval.config import build_eval_config
    from draftsmith.eval.evaluate import run_eval
    from draftsmith.eval.methods import Method
    from draftsmith.eval.prompts.sets import chosen_sets

    methods = list(_csv(args.methods))
    single, named = _drafter_args(args.drafter or [])
    labels = [""] if single else [label for label, _ in named]
    for label in labels:  # each drafter given gets its default method unless one names it
        if not any((p := Method.parse(m)).uses_drafter and p.label == label for m in methods):
            methods.append(str(Method("drafter", label)))
    if args.baselines:
        methods += ["prompt_lookup", "lookahead", "hf_generate", "hf_prompt_lookup"]
        methods += [str(Method("drafter_lookup", label)) for label in labels]
        if args.datastore:
            methods += ["rest"]
        if args.draft_model:
            methods += ["draft_model", "hf_assisted"]
    config = build_eval_config(
        settings=decode_settings_from_args(args), temperature=args.temperature,
        top_p=args.top_p, seed=args.seed, target=args.target, draft_model=args.draft_model,
        drafter=single, drafters=named, dtype=args.dtype, device=args.device,
        bench=chosen_sets(args.bench, bool(args.prompts)),
        prompt_files=tuple(args.prompts or ()), check_lossless=args.check_lossless,
        lossless_samples=args.lossless_samples, batch_sizes=args.batch_size,
        target_quant=args.target_quant, limit=args.limit, max_new_tokens=args.max_new_tokens,
        methods=tuple(dict.fromkeys(methods)), out_dir=args.out,
        trust_remote_code=args.trust_remote_code,
    )
    run_eval(config)
    return 0
