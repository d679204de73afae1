"""The few-row linear form is the same product, and decoding through it stays lossless."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.decoding import few_row_linear
from draftsmith.decoding.decode import generate
from draftsmith.decoding.few_row_linear import (
    few_row_limits,
    install_few_row_linear,
    max_skinny_rows,
    skinny_linear,
)
from draftsmith.decoding.runner import CausalLMRunner
from tests.decoding.test_decode import NEW, _prompt, _reference, proposer_factories
from tests.helpers.tiny_targets import tiny_target


@pytest.mark.parametrize("rows", [1, 2, 5, 17])
def test_skinny_linear_is_the_same_product(rows):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 48, generator=generator, dtype=torch.float64)
    w = torch.randn(80, 48, generator=generator, dtype=torch.float64)
    b = torch.randn(80, generator=generator, dtype=torch.float64)
    out = skinny_linear(x, w, b)
    assert out.shape == (1, rows, 80) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-12, atol=1e-12)


def test_limit_is_the_last_row_count_of_an_unbroken_win():
    assert max_skinny_rows({2: 0.5, 3: 0.6, 4: 0.95, 8: 0.5}) == 3
    assert max_skinny_rows({2: 1.2, 4: 0.5}) == 0
    assert max_skinny_rows({2: 0.5, 32: 0.8}) == 32


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_every_proposer_stays_lossless_through_the_skinny_form(family):
    target = tiny_target(family)
    references = [_reference(target, _prompt(seed)) for seed in range(2)]
    assert install_few_row_linear(target, max_rows=64) > 0
    assert set(few_row_limits(target).values()) == {64}
    runner = CausalLMRunner(target, few_row_linear=False)  # keep the forced limit
    for seed, reference in enumerate(references):
        for name, make in proposer_factories(target, family).items():
            result = generate(runner, make(), _prompt(seed), NEW)
            assert result.tokens == reference, f"{family}/{name} diverged through the skinny form"


def test_probe_result_is_cached_and_zero_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    calls = []

    def fake(out_features, in_features, rows=few_row_linear.PROBE_ROWS, repeats=3):
        calls.append((out_features, in_features))
        return {2: 0.5, 4: 0.5, 8: 1.3}

    monkeypatch.setattr(few_row_linear, "measure_skinny_rows", fake)
    target = tiny_target("llama")
    assert install_few_row_linear(target) > 0
    assert set(few_row_limits(target).values()) == {4}
    probed = len(calls)
    install_few_row_linear(target)
    assert len(calls) == probed  # the second install reads the cache
    install_few_row_linear(target, max_rows=0)
    assert not any("forward" in m.__dict__ for m in target.modules()
                   if isinstance(m, torch.nn.Linear))
