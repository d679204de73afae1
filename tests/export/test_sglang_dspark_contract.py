"""The DSpark export (`--format dspark`) against SGLang 0.5.23's own DSpark loader, read from its
released source (SGLang needs a GPU, so it cannot run here; issue 52 case 8): the architecture
must build `models/dspark.py`'s `Qwen3DSparkModel` (`--speculative-algorithm DSPARK`); every
exported tensor must land, by its `load_weights`, on a parameter the class declares, with that
parameter's shape: `markov_head.*` exactly (an unknown Markov tensor makes SGLang raise), the
Qwen3 backbone through DFlash's loader; every declared parameter must be loaded. SGLang takes the
embedding and head from the target (its loader skips ours) and builds the confidence head only
outside its default `SGLANG_RAGGED_VERIFY_MODE=static`, so both modes are checked. The draft must
run the block as draftsmith trained it: `sample_from_anchor` (row k proposes anchor + k + 1) and
the card's `--speculative-num-draft-tokens`, which SGLang turns into gamma = tokens - 1 query
rows, equal to the block size.

Downloads the sglang wheel once (about 40 MB, cached under the draftsmith cache); skipped with the
reason when PyPI cannot be reached."""

from __future__ import annotations

import json
import re

import pytest
from safetensors.torch import load_file, save_file

from draftsmith.export import export_drafter
from draftsmith.target.offline_models import cache_dir
from tests.export.sglang_dspark_source import (
    DSparkSourceModels,
    dspark_externals,
    load_dflash_backbone,
)
from tests.export.sglang_source import SGLANG_VERSION, Config, sglang_models_dir
from tests.helpers.export_helpers import make_checkpoint

FROM_TARGET = ("lm_head.", "rotary_emb.", "embed_tokens.")  # _DSPARK_SKIPPED_WEIGHT_PREFIXES
SETTINGS = {"block_size": 3, "num_layers": 2, "markov_rank": 8}


@pytest.fixture(scope="module")
def sglang():
    try:
        return DSparkSourceModels(sglang_models_dir(cache_dir() / "engine-sources"))
    except RuntimeError as err:
        pytest.skip(f"cannot download sglang=={SGLANG_VERSION} from PyPI to read its model "
                    f"classes: {err}")


def in_mode(models: DSparkSourceModels, mode: str) -> DSparkSourceModels:
    """SGLang's models/ as run under SGLANG_RAGGED_VERIFY_MODE=`mode`."""
    models.externals = dspark_externals(mode)
    return models


def build(models: DSparkSourceModels, folder):
    """(config.json, the module SGLang builds for it) or (config, the reason it cannot)."""
    config = json.loads((folder / "config.json").read_text())
    arch = config["architectures"][0]
    if models.entry_classes().get(arch) != "dspark":
        return config, (f"architecture {arch} builds models/"
                        f"{models.entry_classes().get(arch, '?')}.py, not SGLang's DSpark class "
                        "(models/dspark.py)")
    try:
        return config, models.construct(arch, "dspark", Config(config))
    except ValueError as err:
        return config, f"SGLang cannot build the draft from config.json: {err}"


def sglang_dspark_mismatches(models: DSparkSourceModels, folder) -> list[str]:
    """What SGLang 0.5.23's DSPARK path would not load, or would run otherwise, as exported."""
    config, declared = build(models, folder)
    if isinstance(declared, str):
        return [declared]
    params, shards = declared.named_parameters(), declared.named_shards()
    heads, backbone = {}, {}
    for name, tensor in load_file(folder / "model.safetensors").items():
        if name.removeprefix("model.").startswith(FROM_TARGET):
            continue  # attach_shared_modules gives the draft the target's
        if name.startswith("confidence_head.") and "confidence_head" not in declared.children:
            continue  # static mode: no confidence head, its tensors skipped
        (heads if name.startswith(("markov_head.", "confidence_head.")) else backbone)[name] = \
            tensor
    problems, loaded = load_dflash_backbone(models, params, shards, backbone)
    for name, tensor in heads.items():  # matched exactly: SGLang raises on any other name
        if name not in params:
            problems.append(f"{name}: no parameter (SGLang raises: unexpected weight)")
        elif tuple(tensor.shape) != tuple(params[name]):
            problems.append(f"{name}: shape {list(tensor.shape)}, SGLang needs "
                            f"{list(params[name])}")
        loaded.add(name)
    problems += [f"{p} {list(s)} is not in the export (" + (
        "SGLang raises: confidence head incomplete" if p.startswith("confidence_head.")
        else "left uninitialised") + ")" for p, s in params.items() if p not in loaded]
    if declared.attrs.get("sample_from_anchor") is not True:
        problems.append("sample_from_anchor: SGLang samples rows 1.. of gamma + 1 queries; "
                        "draftsmith's row k proposes anchor + k + 1")
    if declared.attrs.get("gamma") != config.get("block_size"):
        problems.append(f"gamma {declared.attrs.get('gamma')} != block_size "
                        f"{config.get('block_size')}")
    return problems


def card_gamma(folder) -> int:
    """The gamma SGLang runs with the model card's command (`dspark_config.py`:
    speculative_num_draft_tokens - 1)."""
    found = re.search(r"--speculative-algorithm DSPARK .*?--speculative-num-draft-tokens (\d+)",
                      (folder / "README.md").read_text(), re.S)
    assert found, "the model card has no SGLang DSPARK command"
    return int(found.group(1)) - 1


@pytest.mark.parametrize("mode", ["static", "cap-accept"])
def test_dspark_export_loads_in_sglang(sglang, tmp_path, mode):
    _, module, folder = make_checkpoint(tmp_path, "dspark", settings=SETTINGS)
    out = export_drafter(folder, "dspark", tmp_path / "out")
    models = in_mode(sglang, mode)
    assert sglang_dspark_mismatches(models, out) == []
    config, declared = build(models, out)
    params = declared.named_parameters()
    vocab, hidden, rank = config["vocab_size"], config["hidden_size"], SETTINGS["markov_rank"]
    assert params["markov_head.markov_w1.weight"] == (vocab, rank)
    assert params["markov_head.markov_w2.weight"] == (vocab, rank)
    head = {p: s for p, s in params.items() if p.startswith("confidence_head.")}
    assert head == ({} if mode == "static" else {"confidence_head.proj.weight": (1, hidden + rank),
                                                  "confidence_head.proj.bias": (1,)})
    # the card's SGLang command runs the block draftsmith trained: B query rows, B proposals
    assert card_gamma(out) == declared.attrs["gamma"] == SETTINGS["block_size"] == \
        module.proposals
    # and says what SGLang takes from this folder and when it reads the confidence head
    assert "`SGLANG_RAGGED_VERIFY_MODE=static`" in (out / "README.md").read_text()


def test_dspark_contract_catches_what_sglang_would_not_serve(sglang, tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "dspark", settings=SETTINGS)
    out = export_drafter(folder, "dspark", tmp_path / "out")
    static = in_mode(sglang, "static")
    config = json.loads((out / "config.json").read_text())

    def with_config(**changes) -> None:
        (out / "config.json").write_text(json.dumps({**config, **changes}))

    with_config(markov_head_type=None)
    assert "requires markov_head_type" in sglang_dspark_mismatches(static, out)[0]
    with_config(markov_rank=16)  # weights of rank 8
    assert any("markov_w1.weight: shape" in p for p in sglang_dspark_mismatches(static, out))
    with_config(sample_from_anchor=False)
    assert any(p.startswith("sample_from_anchor") for p in sglang_dspark_mismatches(static, out))
    with_config(architectures=["DFlashDraftModel"])
    assert "not SGLang's DSpark class" in sglang_dspark_mismatches(static, out)[0]
    with_config()
    tensors = load_file(out / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not k.startswith("confidence_head.")},
              out / "model.safetensors")
    assert sglang_dspark_mismatches(static, out) == []  # static mode needs no confidence head
    assert any("confidence head incomplete" in p
               for p in sglang_dspark_mismatches(in_mode(sglang, "cap-accept"), out))
    static = in_mode(sglang, "static")
    save_file({k: v for k, v in tensors.items() if not k.startswith("markov_head.markov_w2")},
              out / "model.safetensors")
    assert any(p.startswith("markov_head.markov_w2.weight") and "uninitialised" in p
               for p in sglang_dspark_mismatches(static, out))
