"""Exports against SGLang's own loaders, read from its released source (SGLang needs a GPU, so it
cannot run here; issue 52): the architecture SGLang builds must be the class of the algorithm
(`--speculative-algorithm EAGLE`: `models/llama_eagle.py`; `EAGLE3`: `models/llama_eagle3.py`;
`DFLASH`: `models/dflash.py`, its config parser stood in for by `DFlashDraftConfig`),
and every exported tensor must land, by the class's weight loader, on a parameter it declares,
with that parameter's shape; every declared parameter but those the worker takes from the target
must be loaded. The old EAGLE-1 export (`LlamaForCausalLM`, `bias: true`) fails.

Downloads the sglang wheel once (about 40 MB, cached under the draftsmith cache); skipped with the
reason when PyPI cannot be reached."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from draftsmith.export import export_drafter
from draftsmith.target.offline_models import cache_dir
from tests.export.sglang_dspark_source import load_dflash_backbone, loader_dict
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


def sglang_eagle3_mismatches(models: SourceModels, folder) -> list[str]:
    """What SGLang 0.5.23's EAGLE-3 path (`LlamaForCausalLMEagle3`) would not load as exported."""
    config = json.loads((folder / "config.json").read_text())
    arch = config["architectures"][0]
    entries = models.entry_classes()
    if entries.get(arch) != "llama_eagle3":
        return [f"architecture {arch} builds models/{entries.get(arch, '?')}.py, not SGLang's "
                "EAGLE-3 class (models/llama_eagle3.py)"]
    declared = models.construct(arch, "llama_eagle3", Config(config))
    params, shards = declared.named_parameters(), declared.named_shards()
    # LlamaForCausalLMEagle3.load_weights: its legacy renames, d2t -> hot token ids, t2d skipped,
    # its stacked mapping, then the name itself or "model." + name
    legacy = loader_dict(models, "llama_eagle3", "LlamaForCausalLMEagle3", "legacy_name_map")
    mapping = stacked_params_mapping(models, "llama_eagle3", "LlamaForCausalLMEagle3")
    problems, loaded = [], set()
    for name, tensor in load_file(folder / "model.safetensors").items():
        original = name
        for old, new in legacy.items():
            name = name.replace(old, new) if old in name else name
        if "d2t" in name:  # the draft vocabulary: one target offset per head row
            rows = params.get("lm_head.weight", (None,))[0]
            if tuple(tensor.shape) != (rows,):
                problems.append(f"d2t: shape {list(tensor.shape)}, the head has {rows} rows")
            continue
        if "t2d" in name:
            continue
        shard = None
        for param_name, weight_name, shard_id in mapping:
            if weight_name in name:
                name, shard = name.replace(weight_name, param_name), shard_id
                break
        target = name if name in params else f"model.{name}"
        if target not in params:
            problems.append(f"{original}: no parameter {target} (skipped by the loader)")
            continue
        want = params[target] if shard is None else shards[target][shard]
        if tuple(tensor.shape) != tuple(want):
            problems.append(f"{original}: shape {list(tensor.shape)}, {target} needs {list(want)}")
        loaded.add(target)
    # the EAGLE-3 worker gives the draft the target's embedding (and its head only when the
    # config has no draft_vocab_size: load_lm_head_from_target)
    from_target = ("model.embed_tokens.",) + (
        ("lm_head.",) if config.get("draft_vocab_size") is None else ())
    problems += [f"{p} {list(s)} is not in the export (left uninitialised)"
                 for p, s in params.items() if p not in loaded and not p.startswith(from_target)]
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    fc = params.get("model.fc.weight")
    if ids is None or fc is None or fc[1] != len(ids) * config.get(
            "target_hidden_size", config["hidden_size"]):
        problems.append(f"eagle_config.eagle_aux_hidden_state_layer_ids {ids}: SGLang captures "
                        "these layers (0-based outputs) and sizes fc by their count")
    return problems


EAGLE3_VARIANTS = {"eagle3": {}, "eagle3.1": {"fc_norm": True, "norm_output": True}}


@pytest.mark.parametrize("variant", list(EAGLE3_VARIANTS))
def test_eagle3_export_loads_in_sglang(sglang, tmp_path, variant):
    settings = {"draft_vocab_size": 100, "layer_ids": [0, 1, 2], **EAGLE3_VARIANTS[variant]}
    _, _, folder = make_checkpoint(tmp_path, "eagle3", settings=settings)
    out = export_drafter(folder, "eagle3", tmp_path / "out")
    assert sglang_eagle3_mismatches(sglang, out) == []
    if variant == "eagle3.1":  # EAGLE-3.1's per-layer norms are declared and loaded
        declared = sglang.construct("LlamaForCausalLMEagle3", "llama_eagle3",
                                    Config(json.loads((out / "config.json").read_text())))
        assert "model.fc_norm.2.weight" in declared.named_parameters()


def test_eagle3_contract_catches_a_lost_head_or_layer_count(sglang, tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle3")
    out = export_drafter(folder, "eagle3", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "eagle_config": {}}))
    assert any("eagle_aux_hidden_state_layer_ids" in p for p in
               sglang_eagle3_mismatches(sglang, out))
    (out / "config.json").write_text(json.dumps({**config, "draft_vocab_size": 64}))
    assert any("lm_head.weight: shape" in p for p in sglang_eagle3_mismatches(sglang, out))
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["Eagle3DraftModel"]}))
    assert "not SGLang's EAGLE-3 class" in sglang_eagle3_mismatches(sglang, out)[0]


@pytest.fixture(scope="module")
def sglang_dflash(sglang):
    from tests.export.sglang_source import DFLASH_EXTERNALS

    sglang.externals.update(DFLASH_EXTERNALS)
    return sglang


def sglang_dflash_mismatches(models: SourceModels, folder) -> list[str]:
    """What SGLang 0.5.23's DFLASH path (`DFlashDraftModel`, models/dflash.py) would not load as
    exported. Its loader resolves a name as written, without or with `model.`, or through its
    vendor aliases, after its stacked mapping (`.q_proj.` -> `qkv_proj` shard q ...), and skips
    what resolves to nothing; the draft has no embedding or head (the target's are used)."""
    config = json.loads((folder / "config.json").read_text())
    arch = config["architectures"][0]
    entries = models.entry_classes()
    if entries.get(arch) != "dflash":
        return [f"architecture {arch} builds models/{entries.get(arch, '?')}.py, not SGLang's "
                "DFlash class (models/dflash.py)"]
    try:
        declared = models.construct(arch, "dflash", Config(config))
    except ValueError as err:
        return [f"SGLang cannot build the draft from config.json: {err}"]
    params, shards = declared.named_parameters(), declared.named_shards()
    problems, loaded = load_dflash_backbone(models, params, shards,
                                            load_file(folder / "model.safetensors"))
    problems += [f"{p} {list(s)} is not in the export (left uninitialised)"
                 for p, s in params.items() if p not in loaded]
    return problems


def test_dflash_export_loads_in_sglang(sglang_dflash, tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "dflash")
    out = export_drafter(folder, "dflash", tmp_path / "out")
    assert sglang_dflash_mismatches(sglang_dflash, out) == []


def test_dflash_contract_catches_what_sglang_would_not_serve(sglang_dflash, tmp_path):
    """A reduced draft vocabulary (SGLang declares no head and skips d2t: the registry refuses
    SGLang for it, issue 52 case 7), ids it would have to guess, the speculators layout."""
    _, _, folder = make_checkpoint(tmp_path, "dflash", settings={
        "block_size": 4, "num_layers": 2, "draft_vocab_size": 60})
    out = export_drafter(folder, "dflash", tmp_path / "vocab")
    assert any(p.startswith("d2t: no parameter") for p in sglang_dflash_mismatches(
        sglang_dflash, out))
    _, _, folder = make_checkpoint(tmp_path / "full", "dflash")
    out = export_drafter(folder, "dflash", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    no_ids = {**config, "dflash_config": {k: v for k, v in config["dflash_config"].items()
                                          if k != "target_layer_ids"}}
    (out / "config.json").write_text(json.dumps(no_ids))
    assert "guess" in sglang_dflash_mismatches(sglang_dflash, out)[0]
    speculators = export_drafter(folder, "dflash-speculators", tmp_path / "speculators")
    assert "not SGLang's DFlash class" in sglang_dflash_mismatches(sglang_dflash, speculators)[0]
