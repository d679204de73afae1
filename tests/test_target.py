"""Target loading: offline real models, GGUF files, local folders, and clear errors for the rest."""

from __future__ import annotations

import time

import pytest
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.target import offline_models
from draftsmith.target.chat import generate_reply
from draftsmith.target.load import load_target, resolve_device, resolve_dtype
from tests.helpers.state import require_offline_model
from tests.helpers.tiny_targets import tiny_target

QUESTION = "What is the capital of France? Answer in one short sentence."


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(offline_models.CATALOG))
def test_offline_model_generates_coherent_text(name):
    require_offline_model(name)
    target = load_target(name, dtype="bfloat16")
    assert not any(p.requires_grad for p in target.model.parameters())
    reply = generate_reply(target, QUESTION, max_new_tokens=24)
    assert "Paris" in reply.text, reply.text
    assert reply.new_tokens < 24, "the reply should end with the chat EOS token"


@pytest.mark.real_model
@pytest.mark.slow
def test_gguf_file_loads_with_the_same_logits_as_the_converted_folder():
    name = require_offline_model("smollm2-135m-instruct")
    gguf = offline_models.gguf_path(name)
    from_gguf = load_target(str(gguf))
    from_folder = load_target(name)
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    torch.testing.assert_close(from_gguf.model(ids).logits, from_folder.model(ids).logits)


def test_local_folder_round_trip(tmp_path):
    model = tiny_target("qwen2")
    model.save_pretrained(tmp_path / "tiny")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(128)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0"))
                            ).save_pretrained(tmp_path / "tiny")
    target = load_target(str(tmp_path / "tiny"), dtype="float32")  # auto may pick bf16 here
    ids = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(target.model(ids).logits, model(ids).logits)


def test_hub_id_without_network_fails_fast_and_points_at_the_offline_path(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed port: no hub here
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(DraftsmithError) as err:
        load_target("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert time.perf_counter() - start < 10
    assert "draftsmith models fetch" in str(err.value)
    assert "unreachable" in str(err.value)


def test_unfetched_offline_model_says_how_to_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    with pytest.raises(DraftsmithError, match="draftsmith models fetch smollm2-135m-instruct"):
        load_target("smollm2-135m-instruct")


@pytest.mark.parametrize("spec, match", [
    ("./no/such/folder", "does not exist"),
    ("/tmp/missing-model.gguf", "does not exist"),
])
def test_bad_paths_are_clear_errors(spec, match):
    with pytest.raises(DraftsmithError, match=match):
        load_target(spec)


@pytest.mark.parametrize("name", ["notes.txt", "model", "weights.safetensors"])
def test_existing_file_that_is_no_target_is_named_as_such(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text("not a model\n")
    for spec in (str(tmp_path / name), name):  # absolute, and relative as a user types it
        with pytest.raises(DraftsmithError) as err:
            load_target(spec)
        message = str(err.value)
        assert (f"target {spec} exists but is a file that is neither a transformers folder, a "
                ".gguf file, an offline model name nor a Hub id") in message
        assert "does not exist" not in message
        assert "an offline model name (`draftsmith models list`), a .gguf file, a transformers " \
               "folder holding config.json, or a Hugging Face Hub id ORG/NAME" in message


@pytest.mark.parametrize("spec", ["org/bad--name", "org/name-", "my model"])
def test_name_that_is_no_hub_id_lists_the_target_forms(spec):
    with pytest.raises(DraftsmithError, match=rf"target {spec!r} is not a file or folder here, an "
                                              r"offline model name nor a valid Hub id; the target "
                                              r"is an offline model name"):
        load_target(spec)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(DraftsmithError, match=r"without config\.json"):
        load_target(str(tmp_path))


def test_dtype_and_device_validation():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(DraftsmithError, match="float32"):
        resolve_dtype("fp8")
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(DraftsmithError, match="no GPU"):
            resolve_device("cuda")
    with pytest.raises(DraftsmithError, match="not a device"):
        resolve_device("gpu0")
