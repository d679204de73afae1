"""The `export` and `push` verbs; `draftsmith.cli` adds them with `add_export_parser(verbs)` and
`add_push_parser(verbs)`."""

from __future__ import annotations

import argparse

from draftsmith.errors import DraftsmithError


def load_target_config(spec: str, trust_remote_code: bool = False):
    """Only the config of a target spec (offline name, folder, .gguf or Hub id): no weights."""
    from transformers import AutoConfig

    from draftsmith.target.source import resolve_source

    source, kwargs = resolve_source(spec)
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as err:
        raise DraftsmithError(f"could not read the config of target {spec!r}: {err}") from err


def cmd_export(args: argparse.Namespace) -> int:
    from draftsmith.export.load import check_exported
    from draftsmith.export.record import ExportOptions
    from draftsmith.export.write import export_drafter

    if args.check:
        extra = [flag for flag, value in (("CKPT", args.checkpoint), ("--format", args.format),
                                          ("--out", args.out)) if value]
        if extra:
            raise DraftsmithError(f"--check DIR validates an existing export; drop {extra}")
        if not args.target:
            raise DraftsmithError("--check DIR needs --target T (the target to check it against)")
        config = load_target_config(args.target, args.trust_remote_code)
        drafter = check_exported(args.check, config, allow_pickle=args.allow_pickle)
        details = [f"hidden_size {drafter.hidden_size}", f"vocab_size {config.vocab_size}"]
        if drafter.draft_vocab_size is not None:
            details.append(f"draft_vocab_size {drafter.draft_vocab_size}")
        if drafter.aux_layer_ids:
            details.append(f"aux layers {drafter.aux_layer_ids} (0-based layer outputs)")
        print(f"ok: {args.check} ({drafter.format} layout, {drafter.kind} drafter) fits "
              f"{args.target}: {', '.join(details)}")
        return 0
    missing = [flag for flag, value in (("CKPT", args.checkpoint), ("--format", args.format),
                                        ("--out", args.out)) if not value]
    if missing:
        raise DraftsmithError(f"`draftsmith export` needs {', '.join(missing)} (or --check DIR "
                              "--target T to validate an export)")
    if args.allow_base_model_mismatch and not args.base_model:
        raise DraftsmithError("--allow-base-model-mismatch only applies with --base-model ORG/NAME; "
                              "drop it or name the base model")
    options = ExportOptions(base_model=args.base_model, dtype=args.dtype,
                            skip_frozen=args.skip_frozen, include_frozen=args.include_frozen,
                            allow_base_model_mismatch=args.allow_base_model_mismatch)
    from draftsmith.export.formats import FORMATS

    if args.format not in (*FORMATS, "gguf"):  # gguf: export/gguf.py, one file
        raise DraftsmithError(f"--format {args.format!r} is not an export format; choose one of: "
                              f"{', '.join((*FORMATS, 'gguf'))}")
    if args.target_dir and args.format != "gguf":
        raise DraftsmithError("--target-dir is for --format gguf (llama.cpp's converter reads the "
                              "target's folder); drop it")
    if args.outtype and args.format != "gguf":
        raise DraftsmithError("--outtype is for --format gguf (llama.cpp's converter); use --dtype "
                              "for a folder export")
    if args.include_frozen and args.skip_frozen:
        raise DraftsmithError("--include-frozen and --skip-frozen contradict each other; pick one")
    print(export_drafter(args.checkpoint, args.format, args.out, eval_json=args.eval_json,
                         options=options, overwrite=args.force, target_dir=args.target_dir,
                         outtype=args.outtype or "f32"))
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from draftsmith.export.push import push_folder

    push_folder(args.folder, args.repo_id, private=args.private, revision=args.revision,
                dry_run=args.dry_run)
    return 0


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    """`draftsmith export CKPT --format F --out DIR` and `draftsmith export --check DIR --target T`."""
    parser = subparsers.add_parser(
        "export", help="export a trained drafter for vLLM / SGLang / reference code, or --check one",
        description="Formats: eagle3 = EAGLE-3 for SGLang (official layout); speculators = EAGLE-3 "
        "for vLLM; eagle = EAGLE-1/2; medusa = FasterDecoding/Medusa heads; mtp = MTP modules in "
        "the DeepSeek-V3 layout; dflash = DFlash for vLLM / SGLang (native layout); "
        "dflash-speculators = DFlash, speculators layout; dspark = DSpark for vLLM (DeepSpec "
        "layout); gguf = EAGLE-3 or DFlash as a llama.cpp draft GGUF (llama.cpp's own "
        "converter). Every folder export carries config.json, safetensors weights, "
        "draftsmith_drafter.json and a README.md model card (gguf: the .gguf, the metadata and "
        "the card).")
    parser.add_argument("checkpoint", nargs="?", metavar="CKPT",
                        help="drafter folder written by `draftsmith train` (OUTPUT_DIR/drafter)")
    parser.add_argument("--format", help="checkpoint layout to write (see above)")
    parser.add_argument("--out", help="export folder to create")
    parser.add_argument("--eval-json", help="eval.json of `draftsmith eval --drafter CKPT`: its "
                        "measured results go into the model card")
    parser.add_argument("--base-model", help="Hub id of the target written into the configs and "
                        "card (default: from the training target); another model than the one "
                        "the drafter was trained for is refused")
    parser.add_argument("--allow-base-model-mismatch", action="store_true",
                        help="accept a --base-model other than the drafter's training target "
                        "(e.g. a quantized re-upload of it; its sizes are still checked)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        help="cast the weights (default: keep the checkpoint's dtype)")
    parser.add_argument("--skip-frozen", action="store_true",
                        help="leave out frozen copies of the target's embedding / head")
    parser.add_argument("--include-frozen", action="store_true",
                        help="dflash / dflash-speculators: also write the target's embedding / "
                        "head, which these layouts leave out by default")
    parser.add_argument("--force", action="store_true",
                        help="replace a previous export in --out (never another folder)")
    parser.add_argument("--target-dir", help="--format gguf: the target's Hugging Face folder "
                        "(config + tokenizer) for llama.cpp's converter (default: the training "
                        "target's, if it is an offline model or a local folder)")
    parser.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0"],
                        help="--format gguf: the draft's weight type (default f32, exact; the "
                        "draft's weights cost memory bandwidth in the engine like the target's)")
    parser.add_argument("--check", metavar="DIR",
                        help="validate an export (or a published drafter) against --target")
    parser.add_argument("--target", help="target for --check: offline name, folder, .gguf or Hub "
                        "id (only its config is read)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run config code from the target's Hub repo (off by default)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="with --check, read *.bin/*.pt weights (tensors only)")
    parser.set_defaults(func=cmd_export)
    return parser


def add_push_parser(subparsers) -> argparse.ArgumentParser:
    """`draftsmith push DIR --repo-id USER/NAME [--private] [--revision R] [--dry-run]`."""
    parser = subparsers.add_parser(
        "push", help="push an export folder to the Hugging Face Hub (one commit)",
        description="The token comes from HF_TOKEN or `hf auth login`; it is never printed.")
    parser.add_argument("folder", metavar="DIR", help="export folder (`draftsmith export --out`)")
    parser.add_argument("--repo-id", required=True, help="USER/NAME or ORG/NAME; created if needed")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--revision", help="branch to commit to (created if missing; default main)")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the files and sizes that would be uploaded; upload nothing")
    parser.set_defaults(func=cmd_push)
    return parser
