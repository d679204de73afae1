"""`draftsmith plan RECIPE`: the arguments, parsed here; the work is in `report.py`."""

from __future__ import annotations

import argparse

from draftsmith.config_values import positive_int_arg
from draftsmith.plan.gpus import GPUS


def add_plan_parser(verbs) -> None:
    plan = verbs.add_parser(
        "plan", help="whether a training recipe fits a GPU: memory per rank from the recipe's "
        "shapes (no weights loaded), a verdict and what to change")
    plan.add_argument("recipe", help="training recipe YAML (see recipes/)")
    plan.add_argument("overrides", nargs="*", help="section.key=value, as for train")
    plan.add_argument("--gpu", default="h100-80gb",
                      help=f"{', '.join(GPUS)}, a memory size (80GB, 24GiB) or cpu (this "
                      "machine's RAM); default h100-80gb")
    plan.add_argument("--gpus", type=positive_int_arg, default=1, help="ranks (processes)")
    plan.add_argument("--sharding", choices=["ddp", "fsdp"], default=None,
                      help="how several ranks train (default ddp, recipes/accelerate/ddp.yaml)")
    plan.add_argument("--target-config", default=None,
                      help="the target's config.json (or its folder) when draftsmith has none")
    plan.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from draftsmith.plan.report import format_report, plan_recipe

    report = plan_recipe(args.recipe, args.overrides, gpu=args.gpu, gpus=args.gpus,
                         sharding=args.sharding, target_config=args.target_config)
    print(format_report(report))
    return 0 if report.verdict != "does not fit" else 1
