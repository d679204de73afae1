"""`draftsmith eval --check-lossless` end to end on a tiny random target saved as a folder: a
random drafter of every registered kind and of each variant in tests/helpers/drafters.py (EAGLE-3.1,
Medusa's shared head; each with its default tree, inside the prompt-lookup
hybrid and, where it has one, a chain), the draft model and prompt lookup pass the greedy float32 gate at batch sizes 1 and 2,
with the batch-size table, JSON and plot written; a batched run that leaves plain decoding fails
the gate naming the method, batch size and first divergent token."""

from __future__ import annotations

import json

import pytest

from draftsmith.eval import executor
from draftsmith.registry import DRAFTERS
from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.gate import every_kind_gate, gate_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(target folder, prompt file, drafter args, methods)."""
    return every_kind_gate(tmp_path_factory.mktemp("gate"))


def test_every_kind_passes_the_greedy_gate_at_every_batch_size(setup, tmp_path):
    result = run_cli(gate_args(setup, tmp_path))
    assert result.returncode == 0, result.stderr
    assert "lossless check passed" in result.stdout
    payload = json.loads((tmp_path / "eval.json").read_text())
    methods = setup[3]
    chains = [m for m in methods if m in payload["batch_sizes"]["2"]]
    assert {"plain", "prompt_lookup", "draft_model", "drafter@mtp"} <= set(chains)
    assert all(f"drafter_chain@{k}" in chains for k, s in DRAFTERS.items()
               if "chain" in s.tree_shapes and s.default_tree != "chain")
    skipped = payload["batch_skipped"]
    assert set(skipped) == set(methods) - set(chains)
    assert all("batch 1 only" in why for why in skipped.values())
    check = payload["lossless_check"]
    assert check["failures"] == []
    assert check["checked"] == methods[1:] + [f"{m} (batch 2)" for m in chains]
    assert payload["batch_sizes"]["2"]["plain"]["speedup"] == 1.0
    assert payload["batch_sizes"]["2"]["plain"]["rows"] == 3  # a batch of 2 and one of 1
    assert (tmp_path / "speedup_by_batch_size.png").stat().st_size > 0
    assert "batch" in result.stdout and "speedup" in result.stdout


def test_a_batched_divergence_fails_the_gate(setup, tmp_path, monkeypatch):
    original = executor.MethodExecutor.run_batch

    def corrupt(self, method, prompts, max_new_tokens):
        result = original(self, method, prompts, max_new_tokens)
        if method == "prompt_lookup" and len(prompts) == 2 and max_new_tokens == 10:
            row = result.rows[1].tokens
            row[2] = (row[2] + 1) % 128
        return result

    monkeypatch.setattr(executor.MethodExecutor, "run_batch", corrupt)
    result = run_cli(gate_args(setup, tmp_path, ["plain", "prompt_lookup"]))
    assert_refused(result, "lossless check failed: prompt_lookup (batch 2) diverged from plain "
                   "decoding on prompts/", "at new token 2")


@pytest.mark.parametrize("value", ["0", "a", "2,,4"])
def test_bad_batch_sizes_are_refused(tmp_path, value):
    result = run_cli(["eval", "--batch-size", value, "--out", str(tmp_path / "out")])
    assert_refused(result, f"--batch-size '{value}'", "e.g. --batch-size 1,2,4,8")
    assert not (tmp_path / "out").exists()
