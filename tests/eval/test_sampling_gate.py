"""The sampling gate of `--check-lossless`: its chi-square test against hand-checked values, and on
a tiny-vocabulary target every method (every registered drafter kind with its default tree, the
draft model) passes while a verifier that accepts every draft fails.

False failures: each gate run tests at level 1e-3 in all (Bonferroni over its tests); the seeds
are fixed, so a given run either passes or fails every time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chi2

from draftsmith.decoding import decode
from draftsmith.decoding.sampling import SamplingConfig, logits_to_probs
from draftsmith.drafter_folder import LoadedDrafter
from draftsmith.eval.batch_sizes import Turn
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.distribution_test import (
    REST,
    chi_square_p_value,
    first_token_bins,
    fit_first_tokens,
)
from draftsmith.eval.executor import MethodExecutor
from draftsmith.eval.lossless import GATE_LEVEL, failure_message, sampling_gate
from draftsmith.eval.settings import DecodeSettings
from draftsmith.registry import DRAFTERS
from draftsmith.target.load import Target
from tests.helpers.drafters import small_settings
from tests.helpers.export_helpers import build_drafter
from tests.helpers.tiny_targets import tiny_target

V = 16
SAMPLES = 120
PROMPT = [3, *(x for t in range(V) for x in (5, t)), 9, 11, 4, 3, 5]  # 5 then every token


def test_p_value_matches_scipy():
    for statistic, dof in [(0.5, 1), (3.2, 4), (30.0, 12), (80.0, 40)]:
        assert chi_square_p_value(statistic, dof) == pytest.approx(chi2.sf(statistic, dof),
                                                                   rel=1e-9)
    assert chi_square_p_value(5.0, 0) == 1.0


def test_bins_cover_the_distribution_and_pool_what_is_rare():
    p1 = torch.tensor([0.6, 0.3, 0.08, 0.02])
    p2 = {0: torch.tensor([0.9, 0.05, 0.05, 0.0]), 1: torch.tensor([0.5, 0.5, 0.0, 0.0])}
    bins, rest = first_token_bins(p1, p2, samples=100, eos={1})
    assert sum(bins.values()) == pytest.approx(1.0)
    # token 0 splits by its second token; EOS token 1 has no second token; token 2 is not split;
    # token 3 (expected twice) is too rare for a bin and joins the least likely one
    assert set(bins) == {(0, 0), (0, "rest"), (1,), (2,)} and rest == (0, "rest")
    assert bins[(0, 0)] == pytest.approx(0.54) and bins[rest] == pytest.approx(0.08)
    bins, _ = first_token_bins(p1, p2, samples=400, eos={1})
    assert set(bins) == {(0, 0), (0, 1), (0, 2), (1,), (2,), (3,)}
    many_rare = torch.tensor([0.5] + [0.025] * 20)
    bins, rest = first_token_bins(many_rare, {}, samples=100)
    assert bins == {(0,): pytest.approx(0.5), REST: pytest.approx(0.5)} and rest == REST


def _draws(p1, p2, n, seed):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x1 = int(torch.multinomial(p1, 1, generator=gen))
        out.append((x1, int(torch.multinomial(p2[x1], 1, generator=gen))))
    return out


def test_exact_draws_pass_and_skewed_draws_fail():
    gen = torch.Generator().manual_seed(0)
    p1 = torch.softmax(torch.randn(V, generator=gen) * 2, -1)
    p2 = {x: torch.softmax(torch.randn(V, generator=gen) * 2, -1) for x in range(V)}
    assert fit_first_tokens(_draws(p1, p2, 400, seed=1), p1, p2).passed(GATE_LEVEL)
    skewed = {x: torch.softmax(p2[x].log() * 2, -1) for x in p2}  # sharper second tokens
    assert not fit_first_tokens(_draws(p1, skewed, 400, seed=1), p1, p2).passed(GATE_LEVEL)
    zero = p1.clone()
    zero[0] = 0.0
    zero /= zero.sum()
    impossible = fit_first_tokens([(0, 1), *_draws(zero, p2, 99, seed=2)], zero, p2)
    assert impossible.impossible == 1 and not impossible.passed(GATE_LEVEL)


def _peaked(seed):
    model = tiny_target("llama", seed=seed, vocab_size=V)
    model.lm_head.weight.data *= 20  # sharp enough that a wrong sampler shows in 120 draws
    return model


def _executor(tmp_path, methods, model, weak, drafters):
    folders = tuple((label, str(tmp_path)) for label in drafters)
    config = EvalConfig(methods=methods, draft_model="weak", drafters=folders, dtype="float32",
                        sampling=SamplingConfig(temperature=1.0, seed=3), check_lossless=True,
                        settings=DecodeSettings(hybrid_min_ngram=2))
    target = Target(model, SimpleNamespace(pad_token_id=0, decode=str), "tiny")
    return MethodExecutor(config, target, weak, {label: (LoadedDrafter(kind, module, {}), model)
                                                 for label, (kind, module) in drafters.items()})


def test_every_method_passes_the_gate_on_a_tiny_vocabulary(tmp_path):
    model, weak = _peaked(0), _peaked(1)
    drafters = {}
    for kind in DRAFTERS:
        settings = small_settings(kind)
        if "draft_vocab_size" in settings:
            settings["draft_vocab_size"] = V - 4
        drafters[kind] = (kind, build_drafter(kind, model, settings))
    # PROMPT ends in 5 and holds 5 followed by every token: whatever the first token x, the
    # suffix (5, x) occurs earlier, so the hybrid (min n-gram 2) drafts its first step from
    # prompt lookup
    methods = ("plain", "draft_model", *(f"drafter@{k}" for k in drafters),
               "drafter_lookup@eagle3")
    executor = _executor(tmp_path, methods, model, weak, drafters)
    report = sampling_gate(executor, [Turn("tiny", "0", 0, PROMPT, [])], SAMPLES, log=lambda m: 0)
    assert [r["method"] for r in report["results"]] == list(methods)
    assert report["failures"] == [], report["results"]
    assert all(r["dof"] >= 4 for r in report["results"]), "too few bins to test anything"
    assert report["level_per_test"] == pytest.approx(GATE_LEVEL / len(methods))


def test_a_verifier_that_accepts_every_draft_fails_the_gate(tmp_path, monkeypatch):
    def accept_all(tree, logits, sampling, generator):
        probs = logits_to_probs(logits[-1], sampling)
        return list(range(tree.size)), int(torch.multinomial(probs, 1, generator=generator))

    monkeypatch.setattr(decode, "verify", accept_all)
    executor = _executor(tmp_path, ("plain", "draft_model"), _peaked(0), _peaked(1), {})
    report = sampling_gate(executor, [Turn("tiny", "0", 0, PROMPT, [])], SAMPLES, log=lambda m: 0)
    assert [f["method"] for f in report["failures"]] == ["draft_model"]
    assert "draft_model on tiny/0: its first 2 tokens do not follow the target's distribution" \
        in failure_message(report)
