"""`draftsmith data run | show | info` end to end on a tiny target saved as a local folder."""

import argparse
import json

import pytest
import yaml

from draftsmith.data.cache_reader import FeatureCache
from draftsmith.data.cli import add_data_parser, main, marked_text
from draftsmith.draft_vocab.file import load_draft_vocab
from draftsmith.errors import DraftsmithError
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer


def data_cli(argv):
    parser = argparse.ArgumentParser(prog="draftsmith")
    add_data_parser(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("data_cli")
    tiny_target("llama").save_pretrained(root / "tiny")
    char_tokenizer().save_pretrained(root / "tiny")
    rows = [{"id": f"r{i}", "conversations": [
        {"from": "human", "value": f"Question number {i}?"}, {"from": "gpt", "value": "Old."},
        {"from": "human", "value": "And then?"}, {"from": "gpt", "value": "Older."}]}
        for i in range(6)]
    (root / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {
        "target": {"name": str(root / "tiny"), "dtype": "float32"},
        "data": {"source": str(root / "chats.jsonl"), "max_length": 300,
                 "out_dir": str(root / "out"),
                 "regenerate": {"max_new_tokens": 6, "batch_size": 3, "shard_size": 2},
                 "cache": {"kinds": ["eagle3"], "dtype": "float32", "shard_tokens": 300},
                 "draft_vocab_size": 32},
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return root


def test_run_stops_resumes_and_writes_everything(workspace, capsys):
    out = workspace / "out"
    argv = ["data", "run", "--config", str(workspace / "recipe.yaml"), "data.limit=5",
            "--no-progress"]
    assert data_cli([*argv, "--stop-after-shards", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["regeneration"]["complete"] is False and "cache" not in summary
    assert "run again to resume" in capsys.readouterr().err

    assert data_cli(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cleaning"]["kept"] == 5
    assert summary["regeneration"]["complete"] and summary["regeneration"]["shards"] == "3/3"
    assert summary["regeneration"]["new_tokens"]["tokens"] > 0
    assert summary["cache"]["complete"] and summary["cache"]["layers"] == [1, 2, 4]
    assert summary["cache"]["bytes_per_token"] >= summary["cache"]["bytes_per_token_layout"]
    cache = FeatureCache.open(out / "cache")
    tokenized = [json.loads(line) for line in (out / "tokenized.jsonl").read_text().splitlines()]
    assert len(tokenized) == cache.num_samples == summary["rendering"]["rendered"]
    vocab = load_draft_vocab(out / "draft_vocab.safetensors")
    assert vocab.d2t.numel() == 32 and vocab.coverage == summary["draft_vocab"]["coverage"]

    assert data_cli(["data", "info", str(out / "cache")]) == 0
    assert data_cli(["data", "info", str(out / "regenerated")]) == 0
    printed = capsys.readouterr().out
    assert "bytes/token on disk" in printed and "5 of 5 conversations done" in printed


def test_regenerate_limit_answers_only_the_first_conversations(workspace):
    out = workspace / "out-limit"
    assert data_cli(["data", "run", "--config", str(workspace / "recipe.yaml"), "--no-progress",
                     f"data.out_dir={out}", "data.regenerate.limit=2", "data.cache=null"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["regeneration"]["conversations"] == 2
    assert summary["regeneration"]["kept_as_written"] == 4
    assert summary["rendering"]["rendered"] == 6
    lines = (out / "tokenized.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines][2:] == ["r2", "r3", "r4", "r5"]


def test_show_marks_trained_tokens(workspace, capsys):
    assert data_cli(["data", "show", "--target", str(workspace / "tiny"),
                     "--source", str(workspace / "chats.jsonl"), "--limit", "1"]) == 0
    printed = capsys.readouterr().out
    assert "<|im_start|>assistant\n[[Old.<|im_end|>]]\n<|im_start|>user\nAnd then?" in printed


def test_marked_text_wraps_runs():
    tokenizer = char_tokenizer()
    ids = tokenizer("abcd", add_special_tokens=False).input_ids
    assert marked_text(tokenizer, ids, [0, 1, 1, 0]) == "a[[bc]]d"
    assert marked_text(tokenizer, ids, [1, 1, 1, 1]) == "[[abcd]]"


def test_errors_are_draftsmith_errors(workspace, tmp_path, capsys):
    with pytest.raises(DraftsmithError, match="unknown key"):
        data_cli(["data", "run", "--config", str(workspace / "recipe.yaml"), "data.lmit=3"])
    with pytest.raises(DraftsmithError, match=r"no manifest\.json"):
        data_cli(["data", "info", str(tmp_path)])
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "draftsmith: error:" in err and "Traceback" not in err
