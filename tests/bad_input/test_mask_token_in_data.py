"""A block drafter's mask token that the data holds (the README: it must never occur) is warned
of when training starts, with counts (issue #55)."""

from __future__ import annotations

from draftsmith.train.mask_token import mask_token_warning
from tests.bad_input.test_recipe_late_values import write_recipe
from tests.helpers.cli import run_cli


def test_a_mask_token_the_data_holds_is_warned_with_counts():
    rows = [[3, 3, 3, 4, 5], [3, 6], [7, 8]]
    warning = mask_token_warning(3, rows, 16)
    assert "drafter.mask_token_id=3 occurs 4 times in 2 of 3 training sequences" in warning
    assert "44.4% of their tokens, the data's most frequent token" in warning
    assert "the data's 2nd most frequent" in mask_token_warning(4, [[3, 3, 4]], 16)
    assert "(not set: the target config's" in mask_token_warning(4, [[4]], 16, chosen=False)
    assert mask_token_warning(9, rows, 16) is None


def test_training_a_block_drafter_warns_of_a_mask_token_in_the_data(tmp_path, tiny_folder):
    drafter = {"kind": "dflash", "block_size": 4, "num_layers": 1, "anchors_per_sequence": 4,
               "mask_token_id": 5}
    result = run_cli(["train", "--config", str(write_recipe(tmp_path, tiny_folder, drafter))])
    assert result.returncode == 0, result.stderr
    assert ("warning: drafter.mask_token_id=5 occurs 24 times in 8 of 8 training sequences"
            in result.stdout + result.stderr)
    result = run_cli(["train", "--config", str(write_recipe(tmp_path, tiny_folder, drafter)),
                      "drafter.mask_token_id=100", f"train.output_dir={tmp_path / 'run2'}"])
    assert result.returncode == 0, result.stderr
    assert "mask_token_id" not in result.stdout + result.stderr
