"""`accelerate launch -m draftsmith.train --config RECIPE [section.key=value ...]`."""

from __future__ import annotations

import argparse
import sys

from draftsmith.errors import DraftsmithError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftsmith.train", description=__doc__)
    parser.add_argument("--config", required=True, help="recipe YAML (see recipes/)")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.lr=1e-4")
    args = parser.parse_args(argv)
    try:
        from draftsmith.process_group import leave_process_group
        from draftsmith.train.run import train_from_recipe

        train_from_recipe(args.config, args.overrides)
        leave_process_group(finished=True)
    except DraftsmithError as err:
        print(f"draftsmith: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before or after the step loop, which saves and stops on Ctrl-C
        print("draftsmith: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a write that the disk had no room for, wherever it was
        from draftsmith.files import disk_full_report

        if (report := disk_full_report(err)) is None:
            raise
        print(f"draftsmith: error: {report}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
