"""The `draftsmith data` verb: run a data recipe, show how conversations render, inspect outputs.

    draftsmith data run --config recipes/data/smollm2-135m-sharegpt.yaml [data.limit=64 ...]
    accelerate launch -m draftsmith data run --config RECIPE   # N processes share the cache
    draftsmith data show --target smollm2-135m-instruct --source sharegpt --limit 2
    draftsmith data info runs/data/smollm2-135m-sharegpt/cache

`python -m draftsmith.data.cli run ...` does the same without the top-level command.
"""

from __future__ import annotations

import argparse
import json
import sys

from draftsmith.config_values import positive_int_arg
from draftsmith.errors import DraftsmithError


def cmd_data_run(args: argparse.Namespace) -> int:
    """One process, or several under `accelerate launch` that split the hidden-state cache
    (rank 0 regenerates, renders, merges the cache manifest and reports)."""
    from draftsmith.data.config import load_data_recipe
    from draftsmith.data.pipeline import run_data_recipe
    from draftsmith.data.ranks import launched_ranks
    from draftsmith.process_group import leave_process_group

    recipe = load_data_recipe(args.config, args.overrides)  # checked before the group forms
    ranks = launched_ranks()
    try:
        run_data_recipe(recipe, stop_after_shards=args.stop_after_shards,
                        progress=not args.no_progress and ranks.is_main,
                        log=lambda m: print(m, file=sys.stderr), ranks=ranks)
    except BaseException:
        leave_process_group(finished=False)
        raise
    leave_process_group(finished=True)
    return 0


def marked_text(tokenizer, input_ids: list[int], loss_mask: list[int]) -> str:
    """The decoded conversation with every trained (loss_mask == 1) run wrapped in [[ ]]."""
    pieces, run, state = [], [], 0
    for token, mask in zip([*input_ids, None], [*loss_mask, -1], strict=True):
        if mask != state:
            text = tokenizer.decode(run)
            pieces.append(f"[[{text}]]" if state == 1 else text)
            run, state = [], mask
        if token is not None:
            run.append(token)
    return "".join(pieces)


def cmd_data_show(args: argparse.Namespace) -> int:
    from draftsmith.data.render import RenderStats, render_conversations, resolve_chat_template
    from draftsmith.data.sources import load_conversations
    from draftsmith.target.load import load_tokenizer

    tokenizer = load_tokenizer(args.target, trust_remote_code=args.trust_remote_code)
    template = resolve_chat_template(tokenizer, args.chat_template)
    conversations, cleaning = load_conversations(args.source, split=args.split, limit=args.limit)
    stats = RenderStats()
    samples = render_conversations(tokenizer, conversations, template, args.max_length, stats)
    for sample in samples:
        print(f"=== {sample.conversation_id}: {len(sample.input_ids)} tokens, "
              f"{sum(sample.loss_mask)} trained on (inside [[ ]]) ===")
        print(marked_text(tokenizer, sample.input_ids, sample.loss_mask))
    print(f"source {args.source}: {cleaning.summary()}", file=sys.stderr)
    print(stats.summary(), file=sys.stderr)
    return 0


def cmd_data_info(args: argparse.Namespace) -> int:
    from pathlib import Path

    from draftsmith.data.shards import MANIFEST, read_manifest

    folder = Path(args.path)
    if not folder.is_dir():
        state = "is a file" if folder.exists() else "does not exist"
        raise DraftsmithError(f"{folder} {state}; pass the regenerated/ or cache/ folder inside a "
                              "`draftsmith data run` data.out_dir")
    manifest = read_manifest(folder)
    if manifest is None:
        inside = [sub for sub in ("regenerated", "cache") if (folder / sub / MANIFEST).is_file()]
        fix = (f"pass {' or '.join(str(folder / sub) for sub in inside)}" if inside else
               "pass the regenerated/ or cache/ folder inside a `draftsmith data run` "
               "data.out_dir")
        raise DraftsmithError(f"{folder} holds no {MANIFEST}: not a regeneration folder or a "
                              f"hidden-state cache; {fix}")
    if manifest.get("kind") not in ("feature_cache", "regenerated") or \
            not isinstance(manifest.get("settings"), dict):
        raise DraftsmithError(f"{folder / MANIFEST} is not a manifest of `draftsmith data run` "
                              f"(kind {manifest.get('kind')!r}); pass a regenerated/ or cache/ "
                              "folder")
    shards = manifest["shards"]
    settings = manifest["settings"]
    target = settings["target"]
    print(f"{manifest['kind']} at {args.path}")
    print(f"target {target['name_or_path']} (config {target['config_sha256'][:12]}, "
          f"vocab {target['vocab_sha256'][:12]})")
    if manifest["kind"] == "feature_cache":
        tokens = sum(s["tokens"] for s in shards)
        size = sum(s["bytes"] for s in shards)
        seconds = sum(s["seconds"] for s in shards)
        print(f"kinds {json.dumps(manifest['kinds'])}, {settings['feature_dtype']}")
        print(f"{len(shards)} shard(s), {sum(s['samples'] for s in shards):,} of "
              f"{settings['samples']:,} samples, {tokens:,} tokens, "
              f"{sum(s['masked_tokens'] for s in shards):,} trained on")
        if tokens:
            print(f"{size / tokens:,.1f} bytes/token on disk ({size / 2**20:,.1f} MiB); "
                  f"extraction {tokens / max(seconds, 1e-9):,.0f} tokens/s")
    else:
        new_tokens = sum(s["new_tokens"] for s in shards)
        seconds = sum(s["seconds"] for s in shards)
        print(f"{len(shards)} shard(s), {sum(s['count'] for s in shards):,} of "
              f"{settings['conversations']:,} conversations done, "
              f"{sum(s['written'] for s in shards):,} written")
        if seconds:
            print(f"{new_tokens:,} new tokens, {new_tokens / seconds:,.1f} tokens/s")
    return 0


def _max_length(text: str) -> int:
    """argparse type of --max-length: an integer >= 16, as data.max_length."""
    value = positive_int_arg(text)
    if value < 16:
        raise argparse.ArgumentTypeError(f"{value} must be >= 16 (e.g. 2048)")
    return value


def add_data_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `data` verb and its actions to a `parser.add_subparsers()` object."""
    from draftsmith.target.offline_models import DEFAULT_TARGET

    data = subparsers.add_parser(
        "data", help="prepare conversations, regenerate responses, cache hidden states")
    actions = data.add_subparsers(dest="data_action", metavar="ACTION", required=True)

    run = actions.add_parser("run", help="run a data recipe (regenerate, cache, draft vocab)")
    run.add_argument("--config", required=True, help="a data recipe YAML (recipes/data/*.yaml) "
                     "or a training recipe (its target and data sections)")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                     help="recipe overrides, e.g. data.limit=64 data.regenerate.max_new_tokens=128")
    run.add_argument("--stop-after-shards", type=positive_int_arg, default=None,
                     help="stop each sharded step after N new shards (run again to resume)")
    run.add_argument("--no-progress", action="store_true", help="hide progress bars")
    run.set_defaults(func=cmd_data_run)

    show = actions.add_parser("show", help="print conversations as rendered, trained tokens in [[ ]]")
    show.add_argument("--target", default=DEFAULT_TARGET,
                      help=f"whose tokenizer and chat template to use (default: {DEFAULT_TARGET})")
    show.add_argument("--trust-remote-code", action="store_true")
    show.add_argument("--source", default="sharegpt", help="sharegpt, a .json/.jsonl file, a "
                      "folder or a Hub dataset id")
    show.add_argument("--split", default="train")
    show.add_argument("--limit", type=positive_int_arg, default=2, help="conversations to show")
    show.add_argument("--max-length", type=_max_length, default=2048,
                      help="tokens per conversation (>= 16; longer ones are truncated)")
    show.add_argument("--chat-template", default=None, help="Jinja template text or .jinja file")
    show.set_defaults(func=cmd_data_show)

    info = actions.add_parser("info", help="summarize a regeneration folder or hidden-state cache")
    info.add_argument("path", help="the folder holding manifest.json")
    info.set_defaults(func=cmd_data_info)
    return data


def main(argv: list[str] | None = None) -> int:
    """`python -m draftsmith.data.cli ACTION ...`: the `data` verb on its own."""
    parser = argparse.ArgumentParser(prog="draftsmith")
    add_data_parser(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(["data", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except DraftsmithError as err:
        print(f"draftsmith: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
