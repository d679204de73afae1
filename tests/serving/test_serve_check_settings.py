"""serve-check's draft length comes from eval's settings (issue 51): a chain drafter drafts
`--num-draft-tokens`, a block drafter its whole block, which `--block-length` may only repeat;
the old `--draft-max` flag is gone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from draftsmith.cli import build_parser
from draftsmith.errors import DraftsmithError
from draftsmith.serving.serve_check_cli import serve_check_settings
from draftsmith.serving.serve_check_run import draft_length

DFLASH = SimpleNamespace(kind="dflash", settings={"block_size": 4})  # 3 proposals a block


def settled(*flags: str) -> int:
    args = build_parser().parse_args(["serve-check", "EXPORT", *flags])
    return draft_length(DFLASH, serve_check_settings(args)).draft_max


def test_a_block_drafter_drafts_its_whole_block():
    assert settled() == 3
    assert settled("--block-length", "3") == 3
    assert settled("--num-draft-tokens", "6") == 3  # a chain's length, not a block's


def test_a_block_length_other_than_the_block_is_refused():
    with pytest.raises(DraftsmithError, match=r"--block-length 2: this dflash export drafts its "
                                              r"whole block, 3 tokens"):
        settled("--block-length", "2")


def test_draft_max_is_no_serve_check_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve-check", "EXPORT", "--draft-max", "3"])
    assert "unrecognized arguments: --draft-max" in capsys.readouterr().err


def test_the_loop_decodes_eval_s_settings_with_the_engine_s_length():
    args = build_parser().parse_args(["serve-check", "EXPORT", "--lookup-tokens", "5"])
    loop = draft_length(DFLASH, serve_check_settings(args)).loop_decode()
    assert (loop.num_draft_tokens, loop.lookup_tokens) == (3, 5)
