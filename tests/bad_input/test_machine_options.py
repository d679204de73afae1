"""`draftsmith machine` checks its output folder and `--context` before it measures: a file given
as `--out` is refused before the target loads, a context below 1 by argparse, and a context that
with the longest forward passes the target's positions before the first timing (issue #18)."""

from __future__ import annotations

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.eval.verify_cost import SIZES, check_context
from tests.helpers.cli import assert_refused, run_cli


@pytest.mark.parametrize("where", ["the file itself", "a folder inside the file"])
def test_an_out_that_is_a_file_is_refused_before_measuring(tmp_path, where):
    existing = tmp_path / "results.json"
    existing.write_text("{}")
    out = existing if where == "the file itself" else existing / "machine"
    result = run_cli(["machine", "--target", str(tmp_path / "no-such-target"), "--out", str(out)])
    assert_refused(result, f"--out {out}: {existing} is a file, not a folder", "pass a folder")
    assert existing.read_text() == "{}"


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_context_below_one_is_refused_by_argparse(tmp_path, value):
    result = run_cli(["machine", "--context", value, "--out", str(tmp_path / "m")])
    assert_refused(result, f"argument --context: {value} must be >= 1")
    assert not (tmp_path / "m").exists()


def test_a_context_past_the_targets_positions_is_refused_after_loading(tmp_path, tiny_folder):
    out = tmp_path / "m"
    result = run_cli(["machine", "--target", str(tiny_folder), "--dtype", "float32", "--context",
                      "500", "--out", str(out)])
    assert_refused(result, f"--context 500 plus the largest forward ({max(SIZES)} tokens) exceeds "
                   "the target's context length of 512 tokens", f"--context {512 - max(SIZES)}")
    assert not (out / "verify_cost.json").exists()


def test_check_context_accepts_what_fits():
    check_context(480, 32, 512)
    check_context(10_000, 32, None)  # a config that names no context length: not checked
    with pytest.raises(DraftsmithError, match=r"--context 0 must be an integer >= 1"):
        check_context(0, 32, 512)
