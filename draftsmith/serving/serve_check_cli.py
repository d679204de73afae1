"""The `serve-check` verb; `draftsmith.cli` adds it with `add_serve_check_parser(verbs)`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.config_values import add_prompt_arguments, positive_int_arg
from draftsmith.eval.settings import add_decode_arguments
from draftsmith.llama_cpp.convert import OUTTYPES
from draftsmith.serving import ENGINES
from draftsmith.target.offline_models import DEFAULT_TARGET

if TYPE_CHECKING:
    from draftsmith.serving.serve_check import ServeCheckSettings


def cmd_serve_check(args: argparse.Namespace) -> int:
    from draftsmith.eval.prompts.files import gather_prompts
    from draftsmith.eval.prompts.sets import chosen_sets
    from draftsmith.serving.serve_check_run import (
        check_targets,
        require_export_folder,
        run_serve_check,
    )
    from draftsmith.target.load import FLAGS, TargetSpec

    # the engine runs the target's GGUF itself: only the name is a setting here
    target = TargetSpec(name=args.target, device=None, where=FLAGS)
    settings = serve_check_settings(args)
    # before any prompt set is installed: the export, the engine's Python, the target's files
    require_export_folder(Path(args.export_dir))
    checked = check_targets(target.name, args.target_gguf, args.engine,
                            target_outtype=args.target_outtype)
    prompts = gather_prompts(chosen_sets(args.bench, bool(args.prompts)), args.prompts or (),
                             args.limit)
    run_serve_check(args.export_dir, target.name, prompts, args.out, settings,
                    target_gguf=args.target_gguf, checked=checked)
    return 0


def serve_check_settings(args: argparse.Namespace) -> ServeCheckSettings:
    """The `ServeCheckSettings` a parsed `serve-check` command line gives, eval's decoding
    settings (`--num-draft-tokens`, `--block-length`, ...) among them."""
    from draftsmith.eval.settings import decode_settings_from_args
    from draftsmith.serving.serve_check import ServeCheckSettings

    return ServeCheckSettings(decode=decode_settings_from_args(args),
                              max_new_tokens=args.max_new_tokens,
                              min_acceptance=args.min_acceptance, threads=args.threads,
                              loop=args.loop, engine=args.engine, device=args.device,
                              dtype=args.dtype, target_outtype=args.target_outtype,
                              draft_outtypes=tuple(t.strip() for t in
                                                   args.draft_outtype.split(",")))


def add_serve_check_parser(subparsers) -> argparse.ArgumentParser:
    """`draftsmith serve-check EXPORT_DIR --engine llama.cpp [--loop] ...`."""
    parser = subparsers.add_parser(
        "serve-check", help="run an EAGLE-3 or DFlash export in a real serving engine: greedy output equal to "
        "the engine's plain decoding, the engine's own acceptance and tau",
        description="Converts the export to a llama.cpp draft GGUF (llama.cpp's own converter, "
        "the engine's version), serves the target's GGUF on loopback plain and with the draft, "
        "decodes the prompts greedily in both and reads the engine's counters. Exits non-zero "
        "when outputs differ or the engine accepts (almost) nothing.")
    parser.add_argument("export_dir", metavar="EXPORT_DIR",
                        help="folder of `draftsmith export CKPT --format eagle3` (or speculators; "
                        "DFlash: dflash or dflash-speculators)")
    parser.add_argument("--engine", default="llama.cpp", choices=ENGINES,
                        help="llama.cpp (the target's GGUF, the draft converted to GGUF) or vllm "
                        "(its CPU build, the target's folder, the export as written); each is "
                        "installed once into its own environment under the draftsmith cache")
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="offline model name, or a Hugging Face folder with --target-gguf")
    parser.add_argument("--target-gguf", help="the target as GGUF for the engine (default: the "
                        "offline model's file)")
    parser.add_argument("--target-outtype", choices=OUTTYPES,
                        help="llama.cpp: serve the target's folder converted by llama.cpp's own "
                        "converter to this type instead of its GGUF (f32: the weights draftsmith's "
                        "float32 loop decodes, so the two compare token for token); converted "
                        "once into the cache")
    add_prompt_arguments(parser, limit=2)
    add_decode_arguments(parser.add_argument_group(
        "decoding", "draftsmith eval's settings: the engine drafts --num-draft-tokens per step (a "
        "block drafter its whole block, which --block-length may only repeat), and --loop "
        "decodes a chain of that length with these settings"))
    parser.add_argument("--draft-outtype", default="f32",
                        help="llama.cpp: the draft GGUF's weight type(s), comma-separated, one "
                        "speculative run each next to one plain run: f32 (exact), f16, bf16, "
                        "q8_0 (a smaller draft reads less memory per step); default f32")
    parser.add_argument("--dtype", default="auto",
                        help="vLLM: its compute dtype, auto (measured here: bfloat16 where "
                        "native bf16 is faster) or float32, bfloat16, float16; float32 compares "
                        "outputs token for token (in bf16 near-tied logits can flip between a "
                        "multi-token verify and a one-token step)")
    parser.add_argument("--min-acceptance", type=float, default=0.05,
                        help="fail when the engine accepts fewer of the draft tokens than this")
    parser.add_argument("--threads", type=positive_int_arg,
                        help="engine CPU threads (default: every core this process may use)")
    parser.add_argument("--device", default="cpu",
                        help="cpu | cuda | cuda:N | auto: where the engines and --loop run; on a "
                        "GPU llama.cpp offloads every layer (-ngl 999) and vLLM runs without its "
                        "CPU-only --enforce-eager --max-num-seqs 1; a GPU needs a CUDA build of "
                        "the engine named by $DRAFTSMITH_LLAMA_CPP_PYTHON / $DRAFTSMITH_VLLM_PYTHON "
                        "(default: cpu)")
    parser.add_argument("--loop", action="store_true",
                        help="also decode with draftsmith's own loop (float32) for side-by-side "
                        "tau and acceptance per draft position")
    parser.add_argument("--out", default="runs/serve_check",
                        help="folder for serve_check.json, the draft GGUF and the engine logs")
    parser.set_defaults(func=cmd_serve_check)
    return parser
