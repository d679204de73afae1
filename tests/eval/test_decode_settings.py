"""The decoding knobs are declared once (`eval/settings.py`): a field added there reaches the
eval CLI's flags, a benchmark's `eval:` keys and serve-check's flags and loop with no other edit;
bench.json records every knob, and a bench config's legacy `tree:` mapping still sets the tree."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import yaml

import draftsmith.eval.settings as settings
from draftsmith.bench.config import load_bench_config
from draftsmith.cli import build_parser
from tests.bad_input.test_bench_config import write_config


def test_a_new_knob_reaches_the_eval_cli_and_bench_configs(monkeypatch, tmp_path, capsys):
    @dataclass(frozen=True)
    class Extended(settings.DecodeSettings):
        new_knob: int = settings.knob(7, "a knob this test adds")

    monkeypatch.setattr(settings, "DecodeSettings", Extended)
    parser = build_parser()
    args = parser.parse_args(["eval", "--new-knob", "9", "--tree-total-tokens", "auto"])
    decoded = settings.decode_settings_from_args(args)
    assert decoded.new_knob == 9 and decoded.autotune
    assert settings.decode_settings_from_args(parser.parse_args(["eval"])).new_knob == 7
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--help"])
    assert "--new-knob NEW_KNOB" in capsys.readouterr().out

    config = load_bench_config(write_config(tmp_path, {"new_knob": 5}))
    assert config.eval.decode.new_knob == 5 and config.eval.record()["new_knob"] == 5


def test_a_bench_config_s_tree_mapping_and_knobs_are_decode_settings(tmp_path):
    path = write_config(tmp_path, {"tree": {"topk": 3, "depth": 4, "total_tokens": 8},
                                   "num_draft_tokens": 3, "lookup_max_ngram": 4})
    decode = load_bench_config(path).eval.decode
    assert (decode.tree_topk, decode.tree_depth, decode.tree_total_tokens) == (3, 4, 8)
    assert decode.num_draft_tokens == 3 and decode.lookup_max_ngram == 4
    record = load_bench_config(path).eval.record()
    assert record["tree"] == {"topk": 3, "depth": 4, "total_tokens": 8}
    assert record["num_draft_tokens"] == 3 and "decode" not in record
    assert yaml.safe_dump(record)  # plain values only


def test_the_eval_defaults_are_the_one_declaration():
    args = build_parser().parse_args(["eval"])
    assert settings.decode_settings_from_args(args) == settings.DecodeSettings()


def test_a_new_knob_reaches_serve_check_and_its_loop(monkeypatch):
    """serve-check takes eval's settings: the same added field is a serve-check flag, rides in
    its settings and reaches the loop it decodes with, the chain the engine's draft length."""
    from types import SimpleNamespace

    from draftsmith.serving.serve_check_cli import serve_check_settings
    from draftsmith.serving.serve_check_run import draft_length

    @dataclass(frozen=True)
    class Extended(settings.DecodeSettings):
        new_knob: int = settings.knob(7, "a knob this test adds")

    monkeypatch.setattr(settings, "DecodeSettings", Extended)
    args = build_parser().parse_args(["serve-check", "EXPORT", "--new-knob", "5",
                                      "--num-draft-tokens", "2"])
    checked = serve_check_settings(args)
    assert checked.decode.new_knob == 5 and checked.draft_max is None
    eagle3 = SimpleNamespace(kind="eagle3", settings={})
    loop = draft_length(eagle3, checked).loop_decode()
    assert (loop.new_knob, loop.num_draft_tokens) == (5, 2)
    default = serve_check_settings(build_parser().parse_args(["serve-check", "EXPORT"]))
    assert draft_length(eagle3, default).draft_max == settings.DecodeSettings().num_draft_tokens
