"""No collective one rank can skip (issue 55): 2 real processes (accelerate launch, gloo) run
every multi-rank path of training with deliberately unequal data per rank, within a timeout.
Before: `evaluate` returned before its reduce on a rank without a held-out batch, DFlash's
`init_from_data` before its collective on a rank without a valid row, offline held-out batches
differed by one between ranks, and a rank-0-only error left the others waiting. Checkpoints need
one output folder that every process sees: per-rank folders (local disks) are refused on all."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from draftsmith.data.cache import build_feature_cache
from draftsmith.data.render import RenderedSample
from draftsmith.engines.server_process import free_port
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer
from tests.train.test_multiprocess import run_or_explain

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "rank_paths.py"


def test_every_multi_rank_path_finishes_with_unequal_data_per_rank(tmp_path):
    target = tiny_target("llama")
    target.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    from draftsmith.target.load import TargetSpec

    loaded = TargetSpec(name=str(tmp_path / "target"), dtype="float32").load()
    samples = [RenderedSample(list(range(2 + i, 18 + i)), [0] * 4 + [1] * 12, f"s{i}")
               for i in range(12)]
    for name in ("intact", "damaged"):
        build_feature_cache(loaded.model, loaded.tokenizer, samples, tmp_path / name,
                            kinds=["eagle1"], dtype="float32", shard_tokens=32, progress=False)
    shard = tmp_path / "damaged" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x40
    shard.write_bytes(bytes(data))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    done = run_or_explain(lambda: [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), str(SCRIPT), str(tmp_path),
        str(tmp_path / "target"), str(tmp_path / "intact"), str(tmp_path / "damaged")],
        env, attempts=1, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    # the evaluation's means are rank 0's two batches', on both ranks
    assert ranks[0]["evaluate"] == ranks[1]["evaluate"] and "eval/acc_0" in ranks[0]["evaluate"]
    assert ranks[0]["dflash_fc"] == ranks[1]["dflash_fc"]  # the same start on every rank
    assert ranks[0]["dflash_kept_random_start"] and ranks[1]["dflash_kept_random_start"]
    held = ranks[0]["eval_batches"][2]
    assert held % 2 == 1, "the split should leave an odd held-out count to deal"
    assert ranks[0]["eval_batches"][:2] == ranks[1]["eval_batches"][:2] == [held // 2] * 2
    assert "shard-00001.safetensors does not match the sha256" in ranks[1]["refused"]
    assert "another process's message names them" in ranks[0]["refused"]
    for rank in ranks:
        assert "cannot see the others' files there" in rank["local_output_refused"]
        assert "rank 0 on" in rank["local_output_refused"] and "rank 1 on" in rank[
            "local_output_refused"]
