"""`draftsmith export --format gguf`: an EAGLE-3 or DFlash drafter as llama.cpp's draft GGUF,
converted by llama.cpp's own converter, with the aux layers (and DFlash's block size and mask
token) where the engine reads them, in each offered weight type; other kinds and a target without
a folder get one clear error."""

import json

import pytest

from draftsmith.cli import main
from draftsmith.llama_cpp.convert import gguf_fields, gguf_target_layers
from draftsmith.target.load import load_target
from draftsmith.target.offline_models import model_dir
from tests.helpers.export_helpers import build_drafter, write_checkpoint
from tests.helpers.state import require_offline_model

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm():
    require_offline_model(NAME)
    return load_target(NAME, dtype="float32")


@pytest.mark.real_model
@pytest.mark.slow
def test_gguf_export_is_a_draft_file_llama_cpp_reads(smollm, tmp_path, capsys):
    settings = {"draft_vocab_size": 256}
    module = build_drafter("eagle3", smollm.model, settings)
    checkpoint = write_checkpoint(tmp_path / "drafter", "eagle3", module, smollm.model, settings)
    out = tmp_path / "gguf"

    target_dir = str(model_dir(NAME))  # the helper's checkpoint names a Hub id, not this folder
    assert main(["export", str(checkpoint), "--format", "gguf", "--out", str(out),
                 "--target-dir", target_dir]) == 0

    assert sorted(p.name for p in out.iterdir()) == ["README.md", "draft-eagle3.gguf",
                                                     "draftsmith_drafter.json"]
    assert gguf_target_layers(out / "draft-eagle3.gguf") == [2, 15, 27]  # layer inputs
    assert json.loads((out / "draftsmith_drafter.json").read_text())["export"]["format"] == "gguf"
    card = (out / "README.md").read_text()
    assert "--spec-type draft-eagle3" in card and "draft-eagle3.gguf" in card
    assert not (tmp_path / "gguf.partial").exists()
    assert main(["export", str(checkpoint), "--format", "gguf", "--out", str(out),
                 "--target-dir", target_dir]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


@pytest.mark.real_model
def test_gguf_export_refuses_other_kinds_and_folderless_targets(smollm, tmp_path, capsys):
    module = build_drafter("eagle1", smollm.model, {})
    checkpoint = write_checkpoint(tmp_path / "eagle1", "eagle1", module, smollm.model, {})
    assert main(["export", str(checkpoint), "--format", "gguf", "--out", str(tmp_path / "a")]) == 2
    assert "holds EAGLE-3 / DFlash / DSpark drafters" in capsys.readouterr().err
    settings = {"draft_vocab_size": 256}
    module = build_drafter("eagle3", smollm.model, settings)
    checkpoint = write_checkpoint(tmp_path / "eagle3", "eagle3", module, smollm.model, settings)
    for extra in ([], ["--target-dir", str(tmp_path)]):  # a Hub id target; a folder of nothing
        assert main(["export", str(checkpoint), "--format", "gguf", "--out", str(tmp_path / "b"),
                     *extra]) == 2
        assert "needs the target's Hugging Face folder" in capsys.readouterr().err
    assert main(["export", str(checkpoint), "--format", "eagle3", "--out", str(tmp_path / "c"),
                 "--target-dir", str(tmp_path)]) == 2
    assert "--target-dir is for --format gguf" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


@pytest.mark.real_model
@pytest.mark.slow
def test_a_speculators_export_converts_with_the_same_layers(smollm, tmp_path):
    from draftsmith.export.gguf import convert_to_gguf
    from draftsmith.export.write import export_drafter

    settings = {"draft_vocab_size": 256}
    module = build_drafter("eagle3", smollm.model, settings)
    checkpoint = write_checkpoint(tmp_path / "drafter", "eagle3", module, smollm.model, settings)
    export = export_drafter(checkpoint, "speculators", tmp_path / "speculators")
    draft = convert_to_gguf(export, model_dir(NAME), tmp_path / "draft.gguf", log=print)
    assert gguf_target_layers(draft) == [2, 15, 27]  # vLLM's numbering = llama.cpp's


@pytest.mark.real_model
@pytest.mark.slow
def test_dflash_gguf_records_layers_block_and_mask_in_each_outtype(smollm, tmp_path, capsys):
    settings = {"block_size": 4, "num_layers": 2}
    module = build_drafter("dflash", smollm.model, settings)
    checkpoint = write_checkpoint(tmp_path / "drafter", "dflash", module, smollm.model, settings)
    sizes = {}
    for outtype in ("f32", "f16", "q8_0"):
        out = tmp_path / outtype
        assert main(["export", str(checkpoint), "--format", "gguf", "--out", str(out),
                     "--target-dir", str(model_dir(NAME)), "--outtype", outtype]) == 0
        assert sorted(p.name for p in out.iterdir()) == ["README.md", "draft-dflash.gguf",
                                                         "draftsmith_drafter.json"]
        fields = gguf_fields(out / "draft-dflash.gguf")
        assert fields["general.architecture"] == "dflash"
        assert fields["dflash.target_layers"] == [i + 1 for i in module.target_layer_ids]
        assert fields["dflash.block_size"] == 4
        assert fields["tokenizer.ggml.mask_token_id"] == module.mask_token_id
        assert fields["dflash.block_count"] == 2
        card = (out / "README.md").read_text()
        assert "--spec-type draft-dflash" in card and "--draft-max 3" in card
        sizes[outtype] = (out / "draft-dflash.gguf").stat().st_size
    assert sizes["f32"] > sizes["f16"] > sizes["q8_0"]
    assert main(["export", str(checkpoint), "--format", "dflash", "--out", str(tmp_path / "x"),
                 "--outtype", "f16"]) == 2
    assert "--outtype is for --format gguf" in capsys.readouterr().err


@pytest.mark.real_model
@pytest.mark.slow
def test_a_dflash_speculators_export_converts_like_the_native_one(smollm, tmp_path):
    from draftsmith.export.gguf import convert_to_gguf
    from draftsmith.export.write import export_drafter

    settings = {"block_size": 4, "num_layers": 2}
    module = build_drafter("dflash", smollm.model, settings)
    checkpoint = write_checkpoint(tmp_path / "drafter", "dflash", module, smollm.model, settings)
    drafts = [convert_to_gguf(export_drafter(checkpoint, fmt, tmp_path / fmt), model_dir(NAME),
                              tmp_path / f"{fmt}.gguf", log=print)
              for fmt in ("dflash", "dflash-speculators")]
    native, speculators = (gguf_fields(d) for d in drafts)
    for key in ("dflash.target_layers", "dflash.block_size", "tokenizer.ggml.mask_token_id",
                "dflash.embedding_length", "dflash.rope.freq_base"):
        assert native[key] == speculators[key], key
    from gguf import GGUFReader

    tensors = [{t.name: (t.tensor_type, t.data.tobytes()) for t in GGUFReader(d).tensors}
               for d in drafts]
    assert tensors[0] == tensors[1] and "fc.weight" in tensors[0]
