"""P-EAGLE's two export layouts: written, read back and decoded with the same trees as before
export (both target families, a random draft vocabulary, EAGLE-3.1's norms), the keys vLLM reads
written explicitly, and the speculators layout run through vLLM's own config conversion
(`update_peagle`) in the vLLM environment when it is installed."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.drafter_folder import LoadedDrafter
from draftsmith.errors import DraftsmithError
from draftsmith.export import ExportOptions, export_drafter, load_exported
from draftsmith.export.peagle import read_peagle
from tests.helpers.export_helpers import (
    PROMPT,
    build_drafter,
    decode_with,
    plain_greedy,
    write_checkpoint,
)
from tests.helpers.tiny_targets import tiny_target

SETTINGS = {"draft_vocab_size": 100, "num_depths": 3, "mask_token_id": 5}
EAGLE31 = {**SETTINGS, "fc_norm": True, "norm_output": True}
FORMATS = ("peagle", "peagle-speculators")


def checkpoint(tmp_path, family="llama", settings=SETTINGS):
    target = tiny_target(family)
    module = build_drafter("peagle", target, settings)
    used = torch.randperm(128, generator=torch.Generator().manual_seed(2))[:100].sort().values
    module.set_draft_vocab(used - torch.arange(100), torch.zeros(128, dtype=torch.bool).index_fill(
        0, used, True))
    module.init_from_target(target)
    module.mask_hidden.data.normal_(generator=torch.Generator().manual_seed(4))
    folder = write_checkpoint(tmp_path / "drafter", "peagle", module, target, settings)
    return target, module, folder


@pytest.mark.parametrize("family, settings", [("llama", SETTINGS), ("qwen2", EAGLE31)],
                         ids=["llama", "qwen2-eagle3.1"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_load_decode_matches_before_export(tmp_path, fmt, family, settings):
    target, module, folder = checkpoint(tmp_path, family, settings)
    before, trees_before = decode_with(target, LoadedDrafter("peagle", module, {}), PROMPT)
    out = export_drafter(folder, fmt, tmp_path / "export")
    loaded = load_exported(out, target)
    after, trees_after = decode_with(target, loaded, PROMPT)
    assert loaded.kind == "peagle" and loaded.meta["format"] == fmt
    for name, value in module.state_dict().items():
        if not name.startswith("rotary."):
            torch.testing.assert_close(loaded.module.state_dict()[name], value, rtol=0, atol=0)
    assert loaded.module.config.mask_token_id == 5 and loaded.module.config.num_depths == 3
    assert trees_after == trees_before
    assert after.tokens == before.tokens == plain_greedy(target, PROMPT)
    assert max(after.depth_per_step) >= 2, "never drafted past depth 1"


def test_the_keys_vllm_reads_are_written_explicitly(tmp_path):
    target, _, folder = checkpoint(tmp_path)
    layout = json.loads((export_drafter(folder, "peagle", tmp_path / "a") / "config.json")
                        .read_text())
    assert layout["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (layout["parallel_drafting"], layout["pard_token"], layout["mask_token_id"],
            layout["norm_before_residual"], layout["num_speculative_tokens"]) == (True, 5, 5,
                                                                                 False, 3)
    spec_dir = export_drafter(folder, "peagle-speculators", tmp_path / "b")
    spec = json.loads((spec_dir / "config.json").read_text())
    assert (spec["speculators_model_type"], spec["architectures"], spec["mask_token_id"],
            spec["norm_before_residual"]) == ("peagle", ["PEagleSpeculator"], 5, False)
    assert spec["speculators_config"]["algorithm"] == "peagle"
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    weights = load_file(spec_dir / "model.safetensors")
    assert weights["mask_hidden"].shape == (1, 1, 3 * target.config.hidden_size)
    assert "layers.0.self_attn.q_proj.weight" in weights and "d2t" in weights


def test_a_folder_without_mask_hidden_is_refused(tmp_path):
    target, _, folder = checkpoint(tmp_path)
    out = export_drafter(folder, "peagle", tmp_path / "export",
                         options=ExportOptions(skip_frozen=True))
    weights = load_file(out / "model.safetensors")
    weights.pop("mask_hidden")
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    # without mask_hidden the folder is plain EAGLE-3's layout; as P-EAGLE it is refused
    assert load_exported(out, target).kind == "eagle3"
    with pytest.raises(DraftsmithError, match="mask_hidden"):
        read_peagle(json.loads((out / "config.json").read_text()), weights, "x")


VLLM_CHECK = """
import json, sys
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
config = SpeculatorsConfig.from_pretrained(sys.argv[1])
spec = SpeculatorsConfig.extract_vllm_speculative_config(
    json.load(open(sys.argv[1] + "/config.json")))
print(json.dumps({"architectures": config.architectures, "pard_token": config.pard_token,
                  "norm_before_residual": config.norm_before_residual,
                  "fc_norm": getattr(config, "fc_norm", None),
                  "norm_output": getattr(config, "norm_output", None),
                  "draft_vocab_size": config.draft_vocab_size,
                  "aux": config.eagle_aux_hidden_state_layer_ids, "spec": spec}))
"""


def test_vllm_maps_the_speculators_layout_to_parallel_drafting(tmp_path):
    """vLLM 0.32's own conversion: PeagleLlamaForCausalLM with pard_token, method eagle3 with
    parallel_drafting, and EAGLE-3.1's norms (which `update_peagle` leaves out of the top level)."""
    from tests.serving.test_vllm_gate import require_vllm

    require_vllm()
    from draftsmith.engines.vllm import engine_python

    _, _, folder = checkpoint(tmp_path, settings=EAGLE31)
    out = export_drafter(folder, "peagle-speculators", tmp_path / "export")
    answer = subprocess.run([str(engine_python()), "-c", VLLM_CHECK, str(out)],
                            capture_output=True, text=True, timeout=300)
    assert answer.returncode == 0, answer.stderr[-2000:]
    seen = json.loads(answer.stdout.strip().splitlines()[-1])
    assert seen["architectures"] == ["PeagleLlamaForCausalLM"]
    assert (seen["pard_token"], seen["norm_before_residual"], seen["fc_norm"],
            seen["norm_output"], seen["draft_vocab_size"]) == (5, False, True, True, 100)
    assert seen["aux"] == [i + 1 for i in (0, 1, 3)]  # 4-layer target: outputs 0, 1, 3 + 1
    assert seen["spec"] == {"method": "eagle3", "parallel_drafting": True,
                            "num_speculative_tokens": 3}
