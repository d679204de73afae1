"""A target of an architecture the drafter kinds do not support (GPT-2: no intermediate_size, no
decoder `layers` list) is refused when it is loaded, naming the architecture, what it lacks and
the supported ones, before any data is prepared (issue #55)."""

from __future__ import annotations

import json

import pytest
import yaml
from transformers import GPT2Config, GPT2LMHeadModel

from draftsmith.registry import DRAFTERS
from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.export_helpers import make_checkpoint
from tests.helpers.tiny_tokenizers import char_tokenizer


def gpt2_config():
    return GPT2Config(vocab_size=128, n_embd=32, n_layer=4, n_head=4, n_positions=512,
                      bos_token_id=0, eos_token_id=1)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(gpt2_config()).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def write_recipe(tmp_path, folder, kind):
    (tmp_path / "chats.jsonl").write_text(json.dumps({"conversations": [
        {"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]}) + "\n")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "target": {"name": str(folder), "dtype": "float32"}, "drafter": {"kind": kind},
        "data": {"source": str(tmp_path / "chats.jsonl"), "out_dir": str(tmp_path / "data")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 2, "warmup_steps": 0}}))
    return path


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "medusa"])
def test_training_on_gpt2_is_refused_before_the_data_step(tmp_path, gpt2_folder, kind):
    result = run_cli(["train", "--config", str(write_recipe(tmp_path, gpt2_folder, kind))])
    line = assert_refused(result, f"{DRAFTERS[kind].title} drafters cannot use",
                          "a gpt2 (GPT2LMHeadModel) target is not supported",
                          "Llama-style decoder targets", "qwen2")
    if kind != "medusa":  # heads on the last hidden state do not read intermediate_size
        assert "its config has no intermediate_size" in line
    assert "keeps no `layers` list" in line
    assert not (tmp_path / "data" / "tokenized.jsonl").exists()  # the data step never ran


def test_a_data_run_caching_for_a_kind_refuses_gpt2_first(tmp_path, gpt2_folder):
    write_recipe(tmp_path, gpt2_folder, "eagle3")
    result = run_cli(["data", "run", "--config", str(tmp_path / "recipe.yaml"),
                      "data.cache.kinds=[eagle3]"])
    assert_refused(result, "EAGLE-3 drafters cannot use", "intermediate_size")
    assert not (tmp_path / "data" / "tokenized.jsonl").exists()


def test_eval_of_a_drafter_on_a_gpt2_target_names_the_architecture(tmp_path, gpt2_folder):
    _, _, drafter = make_checkpoint(tmp_path, "eagle3")  # tiny Llama: same sizes as the GPT-2
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    result = run_cli(["eval", "--target", str(gpt2_folder), "--dtype", "float32", "--drafter",
                      str(drafter), "--methods", "plain,drafter", "--prompts", str(prompts),
                      "--max-new-tokens", "4", "--out", str(tmp_path / "eval")])
    assert_refused(result, "a gpt2 (GPT2LMHeadModel) target is not supported",
                   "its config has no intermediate_size", "Llama-style decoder targets")


def test_plan_of_a_gpt2_config_names_the_architecture(tmp_path, gpt2_folder):
    recipe = write_recipe(tmp_path, gpt2_folder, "eagle3")
    result = run_cli(["plan", str(recipe), "--target-config", str(gpt2_folder / "config.json")])
    assert_refused(result, "EAGLE-3 drafters cannot use", "no intermediate_size",
                   "Llama-style decoder targets", code=2)
