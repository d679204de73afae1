"""What the float32 lossless gate sets and says on a GPU (checked without one): TF32 off,
deterministic algorithms and cuBLAS's workspace; a guarantee per device in the record; a greedy
divergence carries the target's logit gap there, so kernel rounding can be told from a bug."""

from __future__ import annotations

import os

import pytest
import torch

from draftsmith.decoding.runner import CausalLMRunner
from draftsmith.eval.lossless import (
    CPU_GUARANTEE,
    GPU_GUARANTEE,
    device_guarantee,
    failure_message,
    gpu_gate_settings,
    logit_gap,
)
from tests.helpers.tiny_targets import tiny_target


@pytest.fixture
def restore_gpu_settings(monkeypatch):
    """The process-wide switches `gpu_gate_settings` flips, put back after the test."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def test_cpu_gate_sets_nothing(restore_gpu_settings):
    assert gpu_gate_settings("cpu") == CPU_GUARANTEE == device_guarantee("cpu")
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert not torch.are_deterministic_algorithms_enabled()


def test_gpu_gate_is_deterministic_and_says_what_it_promises(restore_gpu_settings):
    torch.backends.cuda.matmul.allow_tf32 = True
    assert gpu_gate_settings("cuda:0") == GPU_GUARANTEE == device_guarantee("cuda")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.are_deterministic_algorithms_enabled()
    assert "does not promise" in GPU_GUARANTEE


def test_logit_gap_is_the_targets_margin_at_the_divergence():
    model = tiny_target("llama")
    prompt, reference = [3, 9, 27], [5, 7, 11]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + reference[:2]])).logits[0, -1]
    runner = CausalLMRunner(model)
    gap = logit_gap(runner, prompt, reference, 2, got=40)
    assert gap == pytest.approx(float(logits[11] - logits[40]), abs=1e-5)
    assert runner.length == 0  # left reset for the next run


def test_a_gpu_failure_names_the_gap_and_the_cpu_rerun():
    failure = {"method": "drafter_dynamic@e3", "set": "gsm8k", "item": "1", "turn": 0,
               "index": 4, "plain": " the", "got": " a", "logit_gap": 2e-6}
    gpu = failure_message({"greedy": True, "guarantee": GPU_GUARANTEE, "failures": [failure]})
    assert "target logit gap 2e-06" in gpu and "rerun with --device cpu" in gpu
    cpu = failure_message({"greedy": True, "guarantee": CPU_GUARANTEE, "failures": [failure]})
    assert "rerun with --device cpu" not in cpu
