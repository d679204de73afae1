"""`--block-length` longer than a block drafter's block was cut silently while eval.json
recorded the length asked for; it is refused (issue #55)."""

from __future__ import annotations

from tests.helpers.cli import assert_refused, run_cli
from tests.helpers.export_helpers import make_checkpoint


def test_a_block_length_longer_than_the_block_is_refused(tmp_path, tiny_folder):
    settings = {"block_size": 4, "num_layers": 1, "anchors_per_sequence": 8}
    _, _, drafter = make_checkpoint(tmp_path, "dflash", settings=settings)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    result = run_cli(["eval", "--target", str(tiny_folder), "--dtype", "float32", "--drafter",
                      str(drafter), "--methods", "plain,drafter", "--block-length", "50",
                      "--prompts", str(prompts), "--max-new-tokens", "4",
                      "--out", str(tmp_path / "eval")])
    assert_refused(result, "--block-length 50 is longer than the drafter proposes",
                   "DFlash drafter with block_size 4 proposes 3 tokens per block",
                   "use --block-length 3 or less")
    assert not (tmp_path / "eval" / "eval.json").exists()
