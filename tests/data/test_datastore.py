"""`draftsmith data` builds REST's datastore (from the run's answers or a corpus file) and
`draftsmith eval --methods rest --datastore` decodes with it, losslessly, recording its numbers."""

from __future__ import annotations

import json

import pytest

from draftsmith.data.config import DataConfig, DataRecipe, DatastoreConfig
from draftsmith.data.datastore import load_datastore
from draftsmith.data.pipeline import run_data_recipe
from draftsmith.errors import DraftsmithError
from draftsmith.eval.config import build_eval_config
from draftsmith.eval.evaluate import run_eval
from draftsmith.eval.settings import DecodeSettings
from draftsmith.target.load import TargetSpec
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("datastore")
    tiny_target("llama").save_pretrained(root / "tiny")
    char_tokenizer().save_pretrained(root / "tiny")
    rows = [{"id": f"r{i}", "conversations": [
        {"from": "human", "value": f"Question {i}?"},
        {"from": "gpt", "value": f"The answer to question {i} is {i * 7}."}]} for i in range(6)]
    (root / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _run(workspace, out: str, datastore: dict):
    data = DataConfig(source=str(workspace / "chats.jsonl"), out_dir=str(workspace / out),
                      regenerate=None, max_length=200, datastore=datastore)
    recipe = DataRecipe(TargetSpec(name=str(workspace / "tiny"), dtype="float32"), data)
    return run_data_recipe(recipe, progress=False, log=lambda message: None)


def test_recipe_key_is_validated():
    assert DataConfig.from_dict({"datastore": {}}).datastore == DatastoreConfig()
    assert DataConfig.from_dict({}).datastore is None
    with pytest.raises(DraftsmithError, match=r"data.datastore.max_tokens = 0"):
        DataConfig.from_dict({"datastore": {"max_tokens": 0}})
    with pytest.raises(DraftsmithError, match=r"unknown key.*data.datastore.size"):
        DataConfig.from_dict({"datastore": {"size": 3}})


def test_data_run_builds_the_datastore_from_the_answers(workspace):
    summary = _run(workspace, "answers", {})
    folder = workspace / "answers" / "datastore"
    records = [json.loads(line) for line in (workspace / "answers" / "tokenized.jsonl").open()]
    answer_tokens = sum(sum(r["loss_mask"]) for r in records)
    assert summary["datastore"]["tokens"] == answer_tokens
    assert summary["datastore"]["documents"] == len(records)  # one answer each
    assert summary["datastore"]["bytes_on_disk"] > 0 and summary["datastore"]["build_seconds"] >= 0
    store = load_datastore(folder)
    manifest = store.manifest
    assert manifest["corpus"]["source"].endswith("tokenized.jsonl")
    assert len(manifest["corpus"]["sha256"]) == 64
    assert manifest["tokenizer"]["vocab_size"] == 128
    answer = char_tokenizer()("is 14.", add_special_tokens=False)["input_ids"]
    assert store.match(answer)[1] > store.match(answer)[0]  # the answers' text is in it


def test_corpus_files_text_and_jsonl_and_max_tokens(workspace):
    (workspace / "corpus.txt").write_text("first document\n\nsecond one\n")
    summary = _run(workspace, "text", {"corpus": str(workspace / "corpus.txt")})
    assert summary["datastore"]["documents"] == 2
    assert summary["datastore"]["tokens"] == len("first document") + len("second one\n")
    (workspace / "corpus.jsonl").write_text(json.dumps({"text": "abcdef"}) + "\n")
    summary = _run(workspace, "jsonl", {"corpus": str(workspace / "corpus.jsonl"),
                                        "max_tokens": 4})
    assert summary["datastore"]["tokens"] == 4
    with pytest.raises(DraftsmithError, match=r"data.datastore.corpus = .* does not exist"):
        _run(workspace, "missing", {"corpus": str(workspace / "nope.txt")})


def test_eval_runs_lookahead_and_rest_losslessly_and_records_the_datastore(workspace, tmp_path):
    _run(workspace, "answers", {})
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Question 2?\nQuestion 5?\n")
    config = build_eval_config(
        target=str(workspace / "tiny"), prompt_files=(str(prompts),), bench=(), limit=2,
        max_new_tokens=24, methods=("plain", "lookahead", "rest"), check_lossless=True,
        settings=DecodeSettings(datastore=str(workspace / "answers" / "datastore")),
        out_dir=str(tmp_path / "eval"))
    payload = run_eval(config, log=lambda message: None)
    summary = payload["summary"]["all"]
    for method in ("lookahead", "rest"):
        assert summary[method]["identical_to_plain"] == 1.0
        assert summary[method]["tau"] >= 1.0 and summary[method]["speedup"] > 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())["summary"]["all"]["rest"]
    store = report["datastore"]
    assert store["lookups"] > 0 and store["lookup_us_p50"] > 0
    assert store["bytes_on_disk"] > 0 and store["build_seconds"] >= 0
    with pytest.raises(DraftsmithError, match=r"needs a datastore: add --datastore"):
        build_eval_config(methods=("plain", "rest"))
    with pytest.raises(DraftsmithError, match=r"--datastore .* does not exist"):
        build_eval_config(methods=("plain", "rest"),
                          settings=DecodeSettings(datastore=str(tmp_path / "nope")))
