"""Shared fixtures: tiny random targets for every family, and the offline real models."""

from __future__ import annotations

import os

import pytest

from draftsmith.target.precision import PROBE_ENV
from tests.helpers.state import reset_accelerate
from tests.helpers.tiny_targets import FAMILIES, tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer

# dtype `auto` answers the same on every CPU kind: the bf16 probe answers float32 unless the run
# sets DRAFTSMITH_BF16_PROBE itself (scripts/test.sh runs the fast selection again with `bf16`;
# `measure` asks this CPU). Subprocesses the tests start inherit it.
os.environ.setdefault(PROBE_ENV, "float32")


@pytest.fixture(params=FAMILIES)
def tiny_model(request):
    """A tiny random target, once per family (Llama, Qwen2)."""
    return tiny_target(request.param)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """A transformers folder (config, weights, tokenizer with a chat template) of a tiny Llama
    (hidden 32, 4 layers, vocab 128)."""
    folder = tmp_path_factory.mktemp("tiny-target")
    tiny_target("llama").save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture
def fresh_accelerate_state():
    """Tests that create Accelerators in this process start and end with a clean state."""
    reset_accelerate()
    yield
    reset_accelerate()
