"""The `--target`, `--dtype`, `--device` and `--trust-remote-code` arguments of every verb that
loads a target (no torch import, so `draftsmith --help` stays fast)."""

from __future__ import annotations

import argparse

from draftsmith.target.offline_models import DEFAULT_TARGET


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """`--target`, `--dtype`, `--device`, `--trust-remote-code`: every verb that loads a target."""
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="offline model name, local folder, .gguf file or Hub id "
                        f"(default: {DEFAULT_TARGET})")
    parser.add_argument("--dtype", default="auto",
                        help="auto (measured: bf16 only where this machine runs it fast) | float32 | "
                        "bfloat16 | float16 (default: auto)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run model code from the Hub repo (off by default)")
