"""Running a command again never silently redoes or mixes work (issue #18): a data run whose
out_dir holds another target's regeneration or cache is refused before tokenized.jsonl is
rewritten; a resumed training run keeps one metrics row per step; a finished run is not retrained,
and another recipe is refused a folder holding a finished drafter."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from tests.helpers.cli import assert_refused, run_cli


@pytest.mark.parametrize("folder", ["regenerated", "cache"])
def test_data_run_refuses_an_out_dir_made_with_another_target(tmp_path, tiny_folder, folder):
    out = tmp_path / "out"
    other = {"name_or_path": "another-model", "config_sha256": "0" * 64, "vocab_sha256": "1" * 64}
    kind = "regenerated" if folder == "regenerated" else "feature_cache"
    (out / folder).mkdir(parents=True)
    (out / folder / "manifest.json").write_text(json.dumps(
        {"kind": kind, "settings": {"target": other}, "shards": []}))
    (out / "tokenized.jsonl").write_text("the other target's tokens\n")
    (tmp_path / "chats.jsonl").write_text(json.dumps({"conversations": [
        {"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]}) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "target": {"name": str(tiny_folder), "dtype": "float32"},
        "data": {"source": str(tmp_path / "chats.jsonl"), "out_dir": str(out),
                 "regenerate": {"max_new_tokens": 4}, "cache": {"kinds": ["eagle1"]}}}))
    result = run_cli(["data", "run", "--config", str(recipe), "--no-progress"])
    assert_refused(result, f"{out / folder} was made with another target", "another-model",
                   "choose another data.out_dir, or delete")
    assert (out / "tokenized.jsonl").read_text() == "the other target's tokens\n"
    assert not (out / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_accelerate_state")
def test_resumed_training_keeps_one_row_per_step_and_a_finished_run_is_not_retrained(
        tmp_path, tiny_folder):
    gen = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(2, 128, (16,), generator=gen).tolist(),
             "loss_mask": [0] * 4 + [1] * 12} for _ in range(12)]
    (tmp_path / "tokenized.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "target": {"name": str(tiny_folder), "dtype": "float32"}, "drafter": {"kind": "eagle1"},
        "data": {"tokenized": str(tmp_path / "tokenized.jsonl")},
        "train": {"output_dir": str(run), "batch_size": 4, "max_steps": 4, "save_every": 2,
                  "warmup_steps": 1, "eval_fraction": 0.2, "mixed_precision": "no"}}))

    def loss_steps():
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["step"] for line in lines if '"loss"' in line]

    assert run_cli(["train", "--config", str(recipe)]).returncode == 0
    assert loss_steps() == [1, 2, 3, 4]
    assert (run / "checkpoints" / "step_2" / "progress.json").is_file()

    for path in sorted((run / "drafter").iterdir()):  # as if killed after the step-2 checkpoint
        path.unlink()
    (run / "drafter").rmdir()
    result = run_cli(["train", "--config", str(recipe)])
    assert result.returncode == 0, result.stderr
    assert "resuming from" in result.stdout and "at step 2" in result.stdout  # accelerator.print
    assert loss_steps() == [1, 2, 3, 4], "resumed at step 2: still one row per step"

    metrics = (run / "metrics.jsonl").read_text()
    weights = (run / "drafter" / "model.safetensors").stat().st_mtime_ns
    result = run_cli(["train", "--config", str(recipe)])
    assert result.returncode == 0
    assert "is already trained by this recipe" in result.stderr
    assert (run / "metrics.jsonl").read_text() == metrics
    assert (run / "drafter" / "model.safetensors").stat().st_mtime_ns == weights

    # another recipe in the same folder would overwrite the drafter and its log: refused
    changed = yaml.safe_load(recipe.read_text())
    changed["train"]["lr"] = 1e-2
    recipe.write_text(yaml.safe_dump(changed))
    result = run_cli(["train", "--config", str(recipe)])
    assert_refused(result, "holds a drafter trained by another recipe", "train.lr=0.01 here",
                   "set another train.output_dir")
    assert (run / "metrics.jsonl").read_text() == metrics
    assert (run / "drafter" / "model.safetensors").stat().st_mtime_ns == weights
