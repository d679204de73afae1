"""Shared test helpers: tiny random targets and tokenizers, drafter checkpoints, decoding references.

Imported as `tests.helpers.X`; the test folders themselves are never importable as top-level
packages (`data`, `eval`, `export` would shadow real names).
"""
