"""The `draftsmith` command line: verbs parsed here, work done by plain functions elsewhere."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from draftsmith.config_values import positive_int_arg
from draftsmith.errors import DraftsmithError
from draftsmith.target.args import add_target_arguments


def cmd_models(args: argparse.Namespace) -> int:
    from draftsmith.target import offline_models

    if args.action == "list":
        for name, model in offline_models.CATALOG.items():
            state = "fetched" if offline_models.is_fetched(name) else "not fetched"
            print(f"{name:32s} {model.hub_id:40s} {model.size / 2**20:8.0f} MiB GGUF  {state}")
        return 0
    if not args.names:
        raise DraftsmithError(f"`draftsmith models {args.action}` needs at least one model name")
    for name in args.names:
        if args.action == "fetch":
            path = offline_models.fetch(name, force=args.force,
                                        log=lambda m: print(m, file=sys.stderr))
        else:
            offline_models.get_offline_model(name)
            if not offline_models.is_fetched(name):
                raise DraftsmithError(f"{name} is not fetched; run `draftsmith models fetch {name}`")
            path = offline_models.model_dir(name)
        print(path)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from draftsmith.target.chat import generate_reply
    from draftsmith.target.load import load_target

    target = load_target(args.target, dtype=args.dtype, device=args.device,
                         trust_remote_code=args.trust_remote_code)
    reply = generate_reply(target, args.prompt, max_new_tokens=args.max_new_tokens)
    print(reply.text)
    print(f"[{reply.new_tokens} tokens in {reply.seconds:.2f} s, "
          f"{reply.tokens_per_second:.1f} tokens/s, {args.target}, "
          f"{target.dtype_choice.dtype}]", file=sys.stderr)
    return 0


def _require_output_folder(out: Path, flag: str) -> None:
    """Create the output folder `out` now, or refuse: a file in its place, or no permission.

    Raises:
        DraftsmithError: naming the flag, the path and what is in the way.
    """
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise DraftsmithError(f"{flag} {out}: {blocker} is a file, not a folder; pass a folder "
                              "(it is created when missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DraftsmithError(f"{flag} {out}: cannot create the folder ({err.strerror}); pass a "
                              "folder you can write") from None


def cmd_machine(args: argparse.Namespace) -> int:
    from draftsmith.eval.verify_cost import format_curve, measure_machine, plot_curve
    from draftsmith.files import write_json
    from draftsmith.target.load import load_target

    out = Path(args.out)
    _require_output_folder(out, "--out")  # before the target loads and the minutes of measuring
    target = load_target(args.target, dtype=args.dtype, device=args.device,
                         trust_remote_code=args.trust_remote_code)
    payload = measure_machine(target, args.device, context_len=args.context)
    write_json(out / "verify_cost.json", payload, indent=1)
    plot = plot_curve(payload, out / "verify_cost.png")
    print(f"{payload['hardware']}; {target.dtype_choice.reason}")
    print(f"few-row linear limits by weight shape: {payload['few_row_limits']}")
    print(format_curve(payload))
    print(f"results: {out / 'verify_cost.json'}; plot: {plot}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from draftsmith.process_group import leave_process_group
    from draftsmith.train.run import train_from_recipe

    path = train_from_recipe(args.config, args.overrides)
    print(path)
    leave_process_group(finished=True)
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from draftsmith.config_values import read_yaml_mapping
    from draftsmith.recipes_index import recipes_root, resolve_recipe, shipped_recipes

    names = shipped_recipes()
    if not names:
        raise DraftsmithError("this installation ships no recipes (no draftsmith/recipes/ and no "
                              "recipes/ beside the package); reinstall draftsmith")
    if args.path:
        path = resolve_recipe(args.path)
        if not path.is_file():
            raise DraftsmithError(f"no shipped recipe {args.path!r}; `draftsmith recipes` lists "
                                  "them")
        print(path)
        return 0
    print(f"recipes in {recipes_root()}: pass a name to --config (`draftsmith plan "
          "llama-3.1-8b/eagle3`), a file path works too; accelerate's --config_file wants the "
          "file: `draftsmith recipes --path accelerate/ddp`", file=sys.stderr)
    for name in names:
        print(f"{name:44s} {_recipe_summary(read_yaml_mapping(name, 'recipe', ''))}")
    return 0


def _recipe_summary(values: dict) -> str:
    """What a recipe is, in a few words: a drafter and its target, data, a benchmark or an
    accelerate config."""
    target = values.get("target")
    target = target.get("name") if isinstance(target, dict) else target
    if "kinds" in values:
        return f"benchmark of {target}: {', '.join(values['kinds'])}"
    if isinstance(values.get("drafter"), dict):
        return f"{values['drafter'].get('kind')} drafter for {target}"
    if "data" in values:
        return f"data for {target}"
    if "distributed_type" in values:
        processes = values.get("num_processes", 1)
        return (f"accelerate config: {values['distributed_type']}, {processes} process"
                + ("es" if processes != 1 else ""))
    return ""


def build_parser() -> argparse.ArgumentParser:
    from draftsmith import __version__

    parser = argparse.ArgumentParser(
        prog="draftsmith",
        description="Train, export and evaluate speculative-decoding drafters.",
    )
    parser.add_argument("--version", action="version", version=f"draftsmith {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    models = verbs.add_parser("models", help="list, fetch or locate the offline real models")
    models.add_argument("action", choices=["list", "fetch", "path"])
    models.add_argument("names", nargs="*", help="offline model names (see `models list`)")
    models.add_argument("--force", action="store_true", help="redo install, assembly and conversion")
    models.set_defaults(func=cmd_models)

    generate = verbs.add_parser("generate", help="plain greedy chat generation with a target")
    add_target_arguments(generate)
    generate.add_argument("--prompt", default="What is speculative decoding? Answer in two sentences.")
    generate.add_argument("--max-new-tokens", type=positive_int_arg, default=64)
    generate.set_defaults(func=cmd_generate)

    machine = verbs.add_parser("machine", help="what this machine makes of a target: dtype chosen "
                               "and why, and the verify-cost curve (forward time of n tokens)")
    add_target_arguments(machine)
    machine.add_argument("--context", type=positive_int_arg, default=200,
                         help="cached tokens before the forward (at least 1; with the longest "
                         "forward, 32 tokens, within the target's context length)")
    machine.add_argument("--out", default="benchmarks/machine",
                         help="folder for verify_cost.json and verify_cost.png")
    machine.set_defaults(func=cmd_machine)

    from draftsmith.bench.cli import add_bench_parser
    from draftsmith.data.cli import add_data_parser
    from draftsmith.eval.cli import add_eval_parser
    from draftsmith.export.cli import add_export_parser, add_push_parser
    from draftsmith.plan.cli import add_plan_parser
    from draftsmith.serving.serve_check_cli import add_serve_check_parser

    add_data_parser(verbs)

    train = verbs.add_parser("train", help="train a drafter from a recipe (one process; use "
                             "`accelerate launch -m draftsmith.train` for several)")
    train.add_argument("--config", required=True, help="recipe YAML (see recipes/)")
    train.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.lr=1e-4")
    train.set_defaults(func=cmd_train)

    add_plan_parser(verbs)
    add_eval_parser(verbs)

    recipes = verbs.add_parser("recipes", help="list the recipes that ship with draftsmith: "
                               "pass a name to --config (`--config llama-3.1-8b/eagle3`)")
    recipes.add_argument("--path", metavar="NAME",
                         help="print the file of one recipe (for accelerate's --config_file)")
    recipes.set_defaults(func=cmd_recipes)

    add_export_parser(verbs)
    add_push_parser(verbs)
    add_bench_parser(verbs)
    add_serve_check_parser(verbs)
    return parser


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds, so servers started for the run are stopped


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return args.func(args)
    except DraftsmithError as err:
        print(f"draftsmith: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftsmith: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a write that the disk had no room for, wherever it was
        from draftsmith.files import disk_full_report

        if (report := disk_full_report(err)) is None:
            raise
        print(f"draftsmith: error: {report}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
