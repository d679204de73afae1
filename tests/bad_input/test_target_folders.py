"""Local target folders that cannot load name what is missing (issue #55): a config-only folder
was blamed on sentencepiece/tiktoken, a pickle-only one was refused with transformers' raw
UnpicklingError (when refused at all)."""

from __future__ import annotations

import pickle
import shutil

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.helpers.cli import assert_refused, run_cli


def generate(folder):
    return run_cli(["generate", "--target", str(folder), "--dtype", "float32",
                    "--max-new-tokens", "2"])


def copy_of(tiny_folder, tmp_path, *names):
    folder = tmp_path / "target"
    folder.mkdir()
    for name in names:
        shutil.copy(tiny_folder / name, folder / name)
    return folder


def test_a_config_only_folder_names_the_missing_weights_and_tokenizer(tmp_path, tiny_folder):
    folder = copy_of(tiny_folder, tmp_path, "config.json")
    assert_refused(generate(folder), f"{folder} holds no weights (no *.safetensors) and no "
                   "tokenizer files", "huggingface-cli download")


def test_a_folder_without_tokenizer_files_names_them(tmp_path, tiny_folder):
    folder = copy_of(tiny_folder, tmp_path, "config.json", "model.safetensors")
    line = assert_refused(generate(folder), f"{folder} holds no tokenizer files",
                          "tokenizer.json", "copy them from the model's repository")
    assert "sentencepiece" not in line.replace("sentencepiece.bpe.model", "")


def test_a_pickle_only_folder_is_refused_with_the_conversion(tmp_path, tiny_folder):
    folder = copy_of(tiny_folder, tmp_path, "config.json", "tokenizer.json",
                     "tokenizer_config.json")
    torch.save(load_file(tiny_folder / "model.safetensors"), folder / "pytorch_model.bin")
    assert_refused(generate(folder), "holds its weights only as a pickle (pytorch_model.bin)",
                   "draftsmith loads safetensors only", "save_pretrained(")


def test_a_pickle_torch_refuses_elsewhere_is_named(tmp_path, tiny_folder, monkeypatch):
    def refuse(*args, **kwargs):
        raise pickle.UnpicklingError("Weights only load failed. This file can still be loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    assert_refused(generate(tiny_folder), "its weights are a pickle that torch refuses to load "
                   "(Weights only load failed.", "draftsmith loads safetensors only")
