"""Where a measurement came from: the code's git commit, stamped next to every result file."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """The short commit of the draftsmith checkout (None outside a git checkout or without git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
