"""Bad-input tests reuse the export tests' tiny drafter checkpoints (tests/export/export_helpers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "export"))
