"""The EAGLE-1/2 export against SGLang's own loader, read from its released source (SGLang needs
a GPU, so it cannot run here; issue 52): the architecture SGLang builds for
`--speculative-algorithm EAGLE` must be its EAGLE-1 class (`models/llama_eagle.py`), and every
exported tensor must land, by the class's weight loader, on a parameter it declares, with that
parameter's shape; every declared parameter but the embedding and head (which the EAGLE worker
takes from the target) must be loaded. The old export (`LlamaForCausalLM`, `bias: true`) fails.

Downloads the sglang wheel once (about 40 MB, cached under the draftsmith cache); skipped with the
reason when PyPI cannot be reached."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from draftsmith.export import export_drafter
from draftsmith.offline_models import cache_dir
from tests.export.sglang_source import (
    SGLANG_VERSION,
    Config,
    SourceModels,
    sglang_models_dir,
    stacked_params_mapping,
)
from tests.helpers.export_helpers import make_checkpoint

FROM_TARGET = ("model.embed_tokens.", "lm_head.")  # the EAGLE worker's set_embed_and_head


@pytest.fixture(scope="module")
def sglang():
    try:
        return SourceModels(sglang_models_dir(cache_dir() / "engine-sources"))
    except RuntimeError as err:
        pytest.skip(f"cannot download sglang=={SGLANG_VERSION} from PyPI to read its model "
                    f"classes: {err}")


def sglang_eagle1_mismatches(models: SourceModels, folder) -> list[str]:
    """What SGLang 0.5.23's EAGLE-1 path would not load as exported (empty: it loads all)."""
    config = json.loads((folder / "config.json").read_text())
    arch = config["architectures"][0]  # SGLang builds the first name it has registered
    entries = models.entry_classes()
    if entries.get(arch) != "llama_eagle":
        return [f"architecture {arch} builds models/{entries.get(arch, '?')}.py, not SGLang's "
                "EAGLE-1 class (models/llama_eagle.py)"]
    declared = models.construct(arch, "llama_eagle", Config(config))
    params, shards = declared.named_parameters(), declared.named_shards()
    # LlamaForCausalLMEagle.load_weights: "model." before all but lm_head, then LlamaForCausalLM's
    mapping = stacked_params_mapping(models, "llama", "LlamaForCausalLM")
    problems, loaded = [], set()
    for name, tensor in load_file(folder / "model.safetensors").items():
        target = name if "lm_head" in name else "model." + name
        shard = None
        for param_name, weight_name, shard_id in mapping:
            if weight_name in target:
                target, shard = target.replace(weight_name, param_name), shard_id
                break
        if target not in params:
            problems.append(f"{name}: no parameter {target} (skipped by the loader)")
            continue
        want = params[target] if shard is None else shards[target][shard]
        if tuple(tensor.shape) != tuple(want):
            problems.append(f"{name}: shape {list(tensor.shape)}, {target} needs {list(want)}")
        loaded.add(target)
    problems += [f"{p} {list(s)} is not in the export (left uninitialised)"
                 for p, s in params.items() if p not in loaded and not p.startswith(FROM_TARGET)]
    return problems


def test_new_eagle1_export_loads_in_sglang(sglang, tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle1")
    out = export_drafter(folder, "eagle", tmp_path / "out")
    assert sglang_eagle1_mismatches(sglang, out) == []


def test_old_eagle1_export_fails_the_contract(sglang, tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle1")
    out = export_drafter(folder, "eagle", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"],
                                                 "bias": True}))  # as draftsmith wrote it
    assert "not SGLang's EAGLE-1 class" in sglang_eagle1_mismatches(sglang, out)[0]
    (out / "config.json").write_text(json.dumps({**config, "bias": True}))  # class fixed only
    problems = sglang_eagle1_mismatches(sglang, out)
    assert any("qkv_proj.bias" in p for p in problems), problems  # attention biases declared


def test_an_export_without_fc_bias_leaves_sglangs_bias_uninitialised(sglang, tmp_path):
    from safetensors.torch import save_file

    _, _, folder = make_checkpoint(tmp_path, "eagle1")
    out = export_drafter(folder, "eagle", tmp_path / "out")
    tensors = load_file(out / "model.safetensors")
    del tensors["fc.bias"]
    save_file(tensors, out / "model.safetensors")
    assert any("model.fc.bias" in p for p in sglang_eagle1_mismatches(sglang, out))
