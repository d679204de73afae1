"""The engine gate on the real SmolLM2-135M: an EAGLE-3 drafter overfit on one answer, exported,
converted to GGUF by llama.cpp's own converter and served by llama.cpp's server (real processes,
real HTTP on loopback) must reproduce the engine's plain greedy output and have its drafts
accepted, a full draft block included; an untrained drafter must fail the check loudly. The same
holds for an overfit DFlash drafter (`draft-dflash`, the whole block as the draft length)."""

import json

import pytest
import torch

from draftsmith.cli import main
from draftsmith.eval.prompts.files import load_prompt_file
from draftsmith.export.write import export_drafter
from draftsmith.llama_cpp.convert import gguf_fields, gguf_target_layers
from draftsmith.llama_cpp.server import LlamaCppServer, complete_greedy
from draftsmith.serving.serve_check import prompt_token_ids
from draftsmith.target.load import load_target
from draftsmith.target.offline_models import gguf_path
from tests.helpers.export_helpers import build_drafter, write_checkpoint
from tests.helpers.state import require_offline_model
from tests.serving.overfit import overfit_dflash, overfit_eagle3

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
NAME = "smollm2-135m-instruct"
NEW_TOKENS = 24
DRAFT_MAX = 3
# An overfit drafter's answer is memorised; through a faithful export the engine accepts most of
# it. A lost layer id, norm or d2t mapping drops this to ~0 (the untrained drafter's level).
ACCEPTANCE_FLOOR = 0.5
# DFlash drafts the whole block from one forward, so a miss early in it loses the rest: measured
# 48% on this gate (13 of 27 draft tokens; position 3 accepted in a third of the blocks) where
# the untrained drafter gets ~5%. The engine's Q4_1 target moves the features the drafter was
# overfit on (float32), so the engine accepts less than the memorised answer would suggest.
DFLASH_ACCEPTANCE_FLOOR = 0.3


@pytest.fixture(scope="module")
def smollm():
    require_offline_model(NAME)
    return load_target(NAME, dtype="float32")


def serve_check(tmp_path, export, prompt_file, *extra) -> tuple[int, dict]:
    out = tmp_path / "serve_check"
    code = main(["serve-check", str(export), "--engine", "llama.cpp", "--target", NAME,
                 "--prompts", str(prompt_file), "--max-new-tokens", str(NEW_TOKENS),
                 "--num-draft-tokens", str(DRAFT_MAX), "--out", str(out), *extra])
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


@pytest.fixture(scope="module")
def dflash_export(smollm, tmp_path_factory):
    """(prompt file, export folder) of a DFlash drafter overfit on the engine's plain answer."""
    tmp_path = tmp_path_factory.mktemp("dflash")
    prompt_file, prompt, answer = engine_answer(smollm, tmp_path)
    checkpoint = overfit_dflash(smollm.model, prompt + answer, len(prompt), tmp_path / "drafter",
                                block_size=DRAFT_MAX + 1)
    return prompt_file, export_drafter(checkpoint, "dflash", tmp_path / "export")


def test_overfit_dflash_drafter_is_accepted_by_llama_cpp(dflash_export, tmp_path):
    prompt_file, export = dflash_export

    # its whole block (DRAFT_MAX tokens); the draft GGUF also in q8_0 (a second speculative run)
    code, result = serve_check(tmp_path, export, prompt_file, "--draft-outtype", "f32,q8_0")

    assert code == 0
    assert result["identical"] == [1, 1]
    assert result["kind"] == "dflash" and result["spec_type"] == "draft-dflash"
    small = result["draft_types"]["q8_0"]
    assert small["identical"] == [1, 1]  # a quantized draft cannot change greedy output
    assert small["draft_gguf_bytes"] < result["draft_types"]["f32"]["draft_gguf_bytes"] / 2
    assert small["acceptance"] > 0
    fields = gguf_fields(tmp_path / "serve_check" / "draft.gguf")
    assert fields["dflash.target_layers"] == [2, 28]  # layer inputs of outputs [1, 27]
    assert fields["dflash.block_size"] == DRAFT_MAX + 1
    engine = result["engine_stats"]
    assert engine["acceptance"] >= DFLASH_ACCEPTANCE_FLOOR, engine
    assert engine["acceptance_per_position"][DRAFT_MAX - 1] > 0, "no full block accepted"
    assert engine["tau"] > 1.5


def test_on_the_f32_target_the_engine_accepts_what_the_loop_accepts(smollm, tmp_path):
    """`--target-outtype f32`: the engine serves the weights the float32 loop decodes, so a
    DFlash drafter overfit on the float32 answer is accepted alike by both: the same drafts, the
    same tokens accepted, position by position."""
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("Write a short poem about the sea.\n")
    prompt = prompt_token_ids(smollm.tokenizer, load_prompt_file(prompt_file))[0]
    answer = smollm.model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                                   do_sample=False)[0, len(prompt):].tolist()
    checkpoint = overfit_dflash(smollm.model, prompt + answer, len(prompt), tmp_path / "drafter",
                                block_size=DRAFT_MAX + 1)
    export = export_drafter(checkpoint, "dflash", tmp_path / "export")

    code, result = serve_check(tmp_path, export, prompt_file, "--target-outtype", "f32",
                               "--loop")

    assert code == 0, result
    assert result["target_outtype"] == "f32" and result["target_gguf"].endswith("-f32.gguf")
    assert result["target_gguf_verified"].startswith("sha256 recorded in")
    assert result["identical"] == [1, 1]
    loop = result["draftsmith"]
    assert loop["same_answer_as_engine"] == [1, 1]
    engine = result["engine_stats"]
    assert engine["acceptance"] >= DFLASH_ACCEPTANCE_FLOOR, engine
    assert engine["acceptance_per_position"][DRAFT_MAX - 1] > 0, "no full block accepted"
    assert loop["counted_from_step"] == 1  # both take the first new token from the prefill
    assert (loop["drafts"], loop["accepted_tokens"]) == (engine["drafts"],
                                                         engine["accepted_tokens"])
    for k, (ours, theirs) in enumerate(zip(loop["acceptance_per_position"],
                                           engine["acceptance_per_position"], strict=True)):
        assert abs(ours - theirs) <= 0.02, (k, loop, engine)


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
