"""Proposers: where draft trees come from (draft models, prompt lookup, trained drafters)."""
