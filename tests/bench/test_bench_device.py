"""`draftsmith bench --device` (and a config's `device:`) reaches every stage: the data recipe's
target, the training process's visible GPUs, each evaluation (int8 passes stay on the CPU) and the
engine check; checked without a GPU (the CUDA check is faked where only the name is read)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftsmith.bench import run as bench_run
from draftsmith.bench import train_process
from draftsmith.bench.config import load_bench_config
from draftsmith.cli import main
from draftsmith.eval.results import write_eval_results
from tests.bench.bench_results import run_of
from tests.bench.test_bench import write_configs


def test_bench_device_flag_is_parsed_and_checked(tmp_path, capsys):
    config = write_configs(tmp_path)
    assert load_bench_config(config).compute_device() == "cpu"  # auto, and no GPU here
    assert load_bench_config(config, "cpu").device == "cpu"
    assert main(["bench", "--config", str(config), "--device", "cuda", "--stages", "none"]) == 2
    assert "--device 'cuda' asked for CUDA but no GPU is visible; use --device cpu" in \
        capsys.readouterr().err


def test_training_sees_the_benchmark_device():
    assert train_process.training_devices("cpu") == {"CUDA_VISIBLE_DEVICES": ""}
    assert train_process.training_devices("cuda:1") == {"CUDA_VISIBLE_DEVICES": "1"}
    assert train_process.training_devices("cuda") == {}


def test_every_stage_gets_the_device(tmp_path, monkeypatch):
    import draftsmith.data.pipeline as pipeline
    import draftsmith.eval.evaluate as evaluate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # only the name is checked
    config = load_bench_config(write_configs(tmp_path), "cuda:1")
    seen = {}

    def fake_data(recipe, **_):
        seen["data"] = recipe.target.device
        return {}

    def fake_eval(eval_config, log=print):
        seen.setdefault("eval", []).append(eval_config.device)
        write_eval_results(Path(eval_config.out_dir) / "eval.json", run_of())

    monkeypatch.setattr(pipeline, "run_data_recipe", fake_data)
    monkeypatch.setattr(evaluate, "run_eval", fake_eval)
    with pytest.raises(Exception, match="did not finish"):  # nothing was written
        bench_run.prepare_data(config)
    assert seen["data"] == "cuda:1"
    bench_run.run_eval_stage(config, tmp_path / "a", ("prompt_lookup",), print, temperature=0.0)
    bench_run.run_eval_stage(config, tmp_path / "b", ("prompt_lookup",), print, temperature=0.0,
                        target_quant=("none", "int8wo"))
    assert seen["eval"] == ["cuda:1", "cpu"]  # int8 copies are CPU kernels
