"""The engine-support table (format x engine version -> proved here / checked against the loader /
loader read / not served) is built from the registries and the committed proofs, and each model
card carries its format's row."""

from __future__ import annotations

from draftsmith.export import export_drafter
from draftsmith.export.engine_support import (
    CONTRACT,
    ENGINE_VERSIONS,
    FAILED,
    NOT_SERVED,
    PROVED,
    READ,
    all_formats,
    cell,
    markdown_table,
)
from draftsmith.export.formats import FORMATS
from tests.helpers.export_helpers import make_checkpoint

VLLM_32, VLLM_33, SGLANG, LLAMA = ENGINE_VERSIONS


def test_every_format_has_a_row_and_every_engine_version_a_column():
    table = markdown_table({})
    assert all(f"`{fmt.name}`" in table for fmt in all_formats())
    assert all(column.label in table.splitlines()[0] for column in ENGINE_VERSIONS)
    assert [fmt.kind for fmt in all_formats() if fmt.name == "gguf"] == ["eagle3", "dflash",
                                                                        "dspark"]


def test_cells_follow_the_registries_and_the_proofs():
    medusa, eagle3, speculators = FORMATS["medusa"], FORMATS["eagle3"], FORMATS["speculators"]
    assert cell(medusa, VLLM_33, {}) == (NOT_SERVED, "vLLM 0.33 removed Medusa")
    assert cell(speculators, SGLANG, {})[0] == NOT_SERVED
    assert cell(eagle3, SGLANG, {})[0] == CONTRACT
    assert cell(FORMATS["mtp"], VLLM_32, {})[0] == NOT_SERVED  # no engine serves draftsmith's MTP
    assert cell(eagle3, VLLM_33, {}) == (READ, "")
    row = {"drafter": "eagle3", "passed": True, "engine": [0.5, 0.3, 0.1],
           "loop": [0.51, 0.3, 0.1], "prompts": 12}
    proofs = {("eagle3", "eagle3", "vllm", "0.32.0"): [row]}
    assert cell(eagle3, VLLM_32, proofs) == (PROVED, "eagle3: 50%/30%/10% vs loop 51%/30%/10%")
    failed = {key: [{**row, "passed": False}] for key in proofs}
    assert cell(eagle3, VLLM_32, failed)[0] == FAILED


def test_the_model_card_names_each_engine_version(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "medusa")
    card = (export_drafter(folder, "medusa", tmp_path / "out") / "README.md").read_text()
    assert "### Engines and versions" in card
    assert "| vLLM 0.33.0 | not served (vLLM 0.33 removed Medusa) |" in card


def test_a_card_says_not_served_where_the_drafter_settings_are_refused(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "dflash", settings={
        "block_size": 4, "num_layers": 2, "draft_vocab_size": 60})
    card = (export_drafter(folder, "dflash", tmp_path / "out") / "README.md").read_text()
    assert "| SGLang 0.5.23 | not served (this drafter's settings" in card
