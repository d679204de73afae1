"""The engine gate on the real SmolLM2-135M: an EAGLE-3 drafter overfit on one answer, exported,
converted to GGUF by llama.cpp's own converter and served by llama.cpp's server (real processes,
real HTTP on loopback) must reproduce the engine's plain greedy output and have its drafts
accepted, a full draft block included; an untrained drafter must fail the check loudly. A DFlash
export takes the same path (`draft-dflash`) and must leave the engine's greedy output unchanged."""

import json

import pytest

from draftsmith.cli import main
from draftsmith.data.prompt_files import load_prompt_file
from draftsmith.engines.engine_requests import complete_greedy
from draftsmith.engines.llama_cpp import LlamaCppServer
from draftsmith.export.gguf import gguf_fields, gguf_target_layers
from draftsmith.export.write import export_drafter
from draftsmith.offline_models import gguf_path
from draftsmith.serving.serve_check import prompt_token_ids
from draftsmith.target import load_target
from tests.helpers.export_helpers import build_drafter, write_checkpoint
from tests.helpers.state import require_offline_model
from tests.serving.overfit import overfit_eagle3

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
NAME = "smollm2-135m-instruct"
NEW_TOKENS = 24
DRAFT_MAX = 3
# An overfit drafter's answer is memorised; through a faithful export the engine accepts most of
# it. A lost layer id, norm or d2t mapping drops this to ~0 (the untrained drafter's level).
ACCEPTANCE_FLOOR = 0.5


@pytest.fixture(scope="module")
def smollm():
    require_offline_model(NAME)
    return load_target(NAME, dtype="float32")


def serve_check(tmp_path, export, prompt_file, *extra) -> tuple[int, dict]:
    out = tmp_path / "serve_check"
    code = main(["serve-check", str(export), "--engine", "llama.cpp", "--target", NAME,
                 "--prompts", str(prompt_file), "--max-new-tokens", str(NEW_TOKENS),
                 "--draft-max", str(DRAFT_MAX), "--out", str(out), *extra])
    return code, json.loads((out / "serve_check.json").read_text())


def engine_answer(smollm, tmp_path) -> tuple:
    """(prompt file, its prompt's token ids, the engine's plain greedy answer)."""
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("Write a short poem about the sea.\n")
    prompt = prompt_token_ids(smollm.tokenizer, load_prompt_file(prompt_file))[0]
    with LlamaCppServer(gguf_path(NAME), parallel=1, ctx_per_slot=256,
                        log_path=tmp_path / "plain.log") as server:
        answer = complete_greedy(server.root_url, prompt, NEW_TOKENS).tokens
    return prompt_file, prompt, answer


def test_overfit_drafter_is_accepted_by_llama_cpp(smollm, tmp_path):
    prompt_file, prompt, answer = engine_answer(smollm, tmp_path)
    checkpoint = overfit_eagle3(smollm.model, prompt + answer, len(prompt), tmp_path / "drafter")
    export = export_drafter(checkpoint, "eagle3", tmp_path / "export")

    code, result = serve_check(tmp_path, export, prompt_file)

    assert code == 0
    assert result["identical"] == [1, 1]
    assert gguf_target_layers(tmp_path / "serve_check" / "draft.gguf") == [2, 15, 27]
    engine = result["engine_stats"]
    assert engine["acceptance"] >= ACCEPTANCE_FLOOR, engine
    assert engine["acceptance_per_position"][DRAFT_MAX - 1] > 0, "no full draft block accepted"
    assert engine["tau"] > 1.5
    assert result["hardware"]["cpu"]


def test_a_dflash_export_serves_in_llama_cpp_with_plain_greedy_output(smollm, tmp_path):
    """DFlash through the whole path: export, llama.cpp's converter (layer inputs, block size in
    the GGUF), `draft-dflash` with the whole block as draft length; the engine's greedy output
    is its plain one. (An untrained drafter: acceptance is not asserted here.)"""
    settings = {"block_size": DRAFT_MAX + 1, "num_layers": 2}
    module = build_drafter("dflash", smollm.model, settings)
    checkpoint = write_checkpoint(tmp_path / "drafter", "dflash", module, smollm.model, settings)
    export = export_drafter(checkpoint, "dflash", tmp_path / "export")
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("Name three colours.\n")

    code, result = serve_check(tmp_path, export, prompt_file, "--min-acceptance", "0",
                               "--max-new-tokens", "12")

    assert code == 0
    assert result["identical"] == [1, 1]
    assert result["kind"] == "dflash" and result["spec_type"] == "draft-dflash"
    fields = gguf_fields(tmp_path / "serve_check" / "draft.gguf")
    assert fields["dflash.target_layers"] == [2, 28]  # layer inputs of outputs [1, 27]
    assert fields["dflash.block_size"] == DRAFT_MAX + 1
    assert result["draft_max"] == DRAFT_MAX
    assert len(result["engine_stats"]["acceptance_per_position"]) == DRAFT_MAX
    assert result["engine_stats"]["draft_tokens"] > 0, "the engine never drafted"


def test_untrained_drafter_fails_the_check(smollm, tmp_path, capsys):
    settings = {"draft_vocab_size": 256}
    module = build_drafter("eagle3", smollm.model, settings)
    checkpoint = write_checkpoint(tmp_path / "drafter", "eagle3", module, smollm.model, settings)
    export = export_drafter(checkpoint, "eagle3", tmp_path / "export")
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("Name three colours.\n")

    code, result = serve_check(tmp_path, export, prompt_file, "--min-acceptance", "0.5",
                               "--max-new-tokens", "8")

    assert code == 2
    assert result["identical"] == [1, 1], "even a useless draft leaves greedy output unchanged"
    assert not result["passed"]
    assert "--min-acceptance" in capsys.readouterr().err


def test_serve_check_refuses_what_is_not_an_eagle3_export(tmp_path, capsys):
    assert main(["serve-check", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["serve-check", str(tmp_path)]) == 2
    assert "not an export folder" in capsys.readouterr().err
