"""A kind whose engine needs more than a method name gets it in the speculative config: P-EAGLE
served by vLLM without `parallel_drafting` is drafted autoregressively with `mask_hidden` skipped,
another drafter than the one trained (the registry's `engine_options`)."""

from __future__ import annotations

from types import SimpleNamespace

from draftsmith.registry import DRAFTERS, get_spec
from draftsmith.serving import serve_check_run
from draftsmith.serving.serve_check import ServeCheckSettings


def test_p_eagle_is_served_by_vllm_with_parallel_drafting(tmp_path, tiny_folder, monkeypatch):
    configs = []

    def run_vllm(target_dir, ids, settings, log_path, speculative=None, log=print, dtype=""):
        configs.append(speculative)
        return SimpleNamespace(reused_from=None)

    monkeypatch.setattr(serve_check_run, "run_vllm", run_vllm)
    monkeypatch.setattr("draftsmith.engines.vllm.engine_record",
                        lambda: {"engine": "vllm", "version": "test"})
    spec = get_spec("peagle")
    method = (spec.engine_methods["vllm"], spec.engine_options["vllm"])
    settings = ServeCheckSettings(draft_max=3, engine="vllm", device="cpu", dtype="float32")
    _, _, served = serve_check_run._run_vllm(tmp_path / "export", tiny_folder, [[1, 2]], settings,
                                             method, tmp_path, lambda line: None)
    speculative = configs[-1]
    assert speculative["method"] == "eagle3" and speculative["parallel_drafting"] is True
    assert speculative["num_speculative_tokens"] == 3 and served["speculative_config"] == speculative


def test_only_kinds_an_engine_serves_carry_options_for_it():
    for spec in DRAFTERS.values():
        assert set(spec.engine_options) <= set(spec.engine_methods), spec.kind
