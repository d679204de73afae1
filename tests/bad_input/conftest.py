"""Fixtures of the bad-input tests: a tiny random target saved as a local folder with a
character tokenizer, so commands that load a target do it in a fraction of a second."""

from __future__ import annotations

import pytest

from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """A transformers folder (config, weights, tokenizer with a chat template) of a tiny Llama."""
    folder = tmp_path_factory.mktemp("tiny-target")
    tiny_target("llama").save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder
