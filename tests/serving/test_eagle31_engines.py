"""EAGLE-3.1 in the engines: llama.cpp's converter and `draft-eagle3` read neither `fc_norm`
weights nor `norm_output`, so `serve-check --engine llama.cpp` and `export --format gguf` refuse
an EAGLE-3.1 drafter before converting or serving anything, naming vLLM and SGLang; vLLM is
gated in tests/serving/test_vllm_gate.py."""

from __future__ import annotations

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.export.write import export_drafter
from draftsmith.serving.serve_check_run import check_servable_export
from tests.helpers.export_helpers import SETTINGS, build_drafter, write_checkpoint
from tests.helpers.tiny_targets import tiny_target

EAGLE31 = {"fc_norm": True, "norm_output": True}


@pytest.fixture
def checkpoints(tmp_path):
    """EAGLE-3 and EAGLE-3.1 (each switch alone too) checkpoints for the tiny target."""
    target = tiny_target("llama")
    folders = {}
    for name, extra in (("eagle3", {}), ("eagle3.1", EAGLE31), ("fc_norm", {"fc_norm": True}),
                        ("norm_output", {"norm_output": True})):
        settings = {**SETTINGS["eagle3"], **extra}
        folders[name] = write_checkpoint(tmp_path / name, "eagle3",
                                         build_drafter("eagle3", target, settings), target,
                                         settings)
    return folders


def test_llama_cpp_refuses_eagle31_and_vllm_takes_it(checkpoints, tiny_folder, tmp_path):
    for name in ("eagle3.1", "fc_norm", "norm_output"):
        export = export_drafter(checkpoints[name], "eagle3", tmp_path / f"export-{name}")
        with pytest.raises(DraftsmithError, match=r"EAGLE-3\.1 .* is not served by llama\.cpp") as err:
            check_servable_export(export, tiny_folder, "llama.cpp")
        assert "--engine vllm" in str(err.value) and "SGLang" in str(err.value)
        check_servable_export(export, tiny_folder, "vllm")
    plain = export_drafter(checkpoints["eagle3"], "eagle3", tmp_path / "export-eagle3")
    check_servable_export(plain, tiny_folder, "llama.cpp")


def test_gguf_export_refuses_eagle31_before_converting(checkpoints, tmp_path):
    with pytest.raises(DraftsmithError, match=r"--format gguf: .* not served by llama\.cpp"):
        export_drafter(checkpoints["eagle3.1"], "gguf", tmp_path / "gguf")
    assert not (tmp_path / "gguf").exists()
