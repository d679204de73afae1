"""Fixtures of the bad-input tests: a tiny random target saved as a local folder with a
character tokenizer, so commands that load a target do it in a fraction of a second."""

from __future__ import annotations



