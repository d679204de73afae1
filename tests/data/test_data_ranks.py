"""`draftsmith data run` as its own distributed step: a real 2-process run through `accelerate
launch` on CPU (gloo) writes the same hidden-state cache as one process (each rank its shards,
one manifest merged by rank 0); a several-process `train` refuses to prepare data itself; the
rank records of a killed run are merged only where their shard is whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from draftsmith.data.config import load_data_recipe
from draftsmith.data.pipeline import unfinished
from draftsmith.data.shards import MANIFEST, merge_rank_records, rank_record
from draftsmith.engines.server_process import free_port
from draftsmith.errors import DraftsmithError
from draftsmith.files import write_json
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer
from tests.train.test_multiprocess import run_or_explain

SHARD_KEYS = ("index", "file", "samples", "tokens", "masked_tokens", "bytes")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("data_ranks")
    tiny_target("llama").save_pretrained(root / "tiny")
    char_tokenizer().save_pretrained(root / "tiny")
    rows = [{"id": f"r{i}", "conversations": [
        {"from": "human", "value": f"Question number {i}: " + "why? " * (i % 4)},
        {"from": "gpt", "value": "Because " * (1 + i % 3)}]} for i in range(12)]
    (root / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {  # a training recipe: `data run` takes its target and data sections
        "target": {"name": str(root / "tiny"), "dtype": "float32"},
        "drafter": {"kind": "eagle3", "draft_vocab_size": 32, "ttt_steps": 2},
        "data": {"source": str(root / "chats.jsonl"), "max_length": 200, "regenerate": None,
                 "cache": {"kinds": ["eagle3"], "dtype": "float32", "shard_tokens": 150,
                           "batch_size": 3},
                 "draft_vocab_size": 32},
        "train": {"features": "offline", "max_steps": 2, "warmup_steps": 0,
                  "mixed_precision": "no"},
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return root


@pytest.mark.slow
def test_two_processes_write_the_cache_one_process_writes(workspace):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    command = ["-m", "draftsmith", "data", "run", "--config", str(workspace / "recipe.yaml"),
               "--no-progress"]
    one = subprocess.run([sys.executable, *command, f"data.out_dir={workspace / 'one'}"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_or_explain(lambda: [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), *command,
        f"data.out_dir={workspace / 'two'}"], env)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 1 of 2: wrote " in two.stderr and "rank 1 of 2: wrote 0 " not in two.stderr

    a = json.loads((workspace / "one/cache" / MANIFEST).read_text())
    b = json.loads((workspace / "two/cache" / MANIFEST).read_text())
    assert len(a["shards"]) >= 4  # both ranks wrote shards
    assert [{k: s[k] for k in SHARD_KEYS} for s in a["shards"]] == \
        [{k: s[k] for k in SHARD_KEYS} for s in b["shards"]]
    assert a["settings"] == b["settings"]
    assert not list((workspace / "two/cache").glob("manifest.rank-*.json"))
    for shard in a["shards"]:
        x = load_file(workspace / "one/cache" / shard["file"])
        y = load_file(workspace / "two/cache" / shard["file"])
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]), (shard["file"], key)
    summary = json.loads((workspace / "two/summary.json").read_text())
    assert summary["cache"]["complete"] and summary["cache"]["samples"] == 12
    assert load_file(workspace / "one/draft_vocab.safetensors").keys() == \
        load_file(workspace / "two/draft_vocab.safetensors").keys()
    recipe = load_data_recipe(workspace / "recipe.yaml", [f"data.out_dir={workspace / 'two'}"])
    assert unfinished(recipe) is None


def test_unfinished_names_what_is_missing(workspace, tmp_path):
    recipe = load_data_recipe(workspace / "recipe.yaml", [f"data.out_dir={tmp_path}"])
    assert "no finished data run" in unfinished(recipe)


def test_a_multiprocess_train_refuses_unprepared_data(workspace, tmp_path):
    from draftsmith.train.recipe import load_recipe
    from draftsmith.train.run import build_examples

    class TwoRanks:  # what the loop reads of an Accelerator here
        num_processes = 2

    recipe = load_recipe(workspace / "recipe.yaml", [f"data.out_dir={tmp_path}"])
    with pytest.raises(DraftsmithError) as err:
        build_examples(recipe, TwoRanks(), target=None, recipe_path="my.yaml")
    message = str(err.value)
    assert "accelerate launch -m draftsmith data run --config my.yaml" in message
    assert "no finished data run" in message


def test_rank_records_merge_only_whole_shards(tmp_path):
    (tmp_path / "shard-00001.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "shard-00003.safetensors").write_bytes(b"x" * 4)  # cut short by a kill
    manifest = {"kind": "feature_cache", "settings": {}, "shards": [
        {"index": 0, "file": "shard-00000.safetensors", "bytes": 1}]}
    write_json(tmp_path / MANIFEST, manifest)
    write_json(rank_record(tmp_path, 1), {"shards": [
        {"index": 1, "file": "shard-00001.safetensors", "bytes": 10},
        {"index": 3, "file": "shard-00003.safetensors", "bytes": 10}]})
    assert merge_rank_records(tmp_path, manifest) == 1
    saved = json.loads((tmp_path / MANIFEST).read_text())
    assert [s["index"] for s in saved["shards"]] == [0, 1]
    assert not rank_record(tmp_path, 1).exists()


def test_a_training_recipe_is_a_data_recipe(workspace):
    recipe = load_data_recipe(workspace / "recipe.yaml")
    assert recipe.target.device == "auto"
    assert list(recipe.data.cache.kinds) == ["eagle3"]


@pytest.mark.slow
def test_a_two_process_run_whose_source_fails_ends_with_the_error(workspace, tmp_path):
    """Rank 0 fails after the group formed (no usable conversations); rank 1, released, finds rank
    0 gone at the last barrier: the run ends at once, non-zero, with rank 0's one clear error."""
    (tmp_path / "empty.jsonl").write_text("")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    two = run_or_explain(lambda: [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), "-m", "draftsmith", "data", "run", "--config",
        str(workspace / "recipe.yaml"), "--no-progress", f"data.source={tmp_path / 'empty.jsonl'}",
        f"data.out_dir={tmp_path / 'out'}"], env, timeout=120)
    assert two.returncode != 0
    errors = [line for line in two.stderr.splitlines() if line.startswith("draftsmith: error")]
    assert errors and all("gave no usable conversations" in e for e in errors), two.stderr[-3000:]
    assert not (tmp_path / "out" / "summary.json").exists()
