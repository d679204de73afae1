"""`draftsmith eval` refuses bad flags before it loads a model or writes eval.json: argparse names
the flag for numbers out of range, the run names device, dtype, method, prompt set or drafter
folder with the fix (issue #18)."""

from __future__ import annotations

import pytest

from tests.helpers.cli import assert_refused, run_cli


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--num-draft-tokens", "0", "argument --num-draft-tokens: 0 must be >= 1"),
    ("--lookup-tokens", "0", "argument --lookup-tokens: 0 must be >= 1"),
    ("--lookup-max-ngram", "0", "argument --lookup-max-ngram: 0 must be >= 1"),
    ("--tree-total-tokens", "abc", "argument --tree-total-tokens: 'abc' is not an integer"),
    ("--limit", "0", "argument --limit: 0 must be >= 1"),
])
def test_numbers_out_of_range_are_refused_by_argparse(tmp_path, flag, value, message):
    out = tmp_path / "eval"
    result = run_cli(["eval", flag, value, "--out", str(out)], subprocess_run=True)
    assert_refused(result, message)
    assert not out.exists()


@pytest.fixture
def drafter_file(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"not a folder")
    return path


@pytest.mark.parametrize(("args", "phrases"), [
    (["--device", "tpu"], ["--device 'tpu' is not a device", "use cpu, cuda, cuda:N or auto"]),
    (["--dtype", "fp8"], ["--dtype 'fp8' is not supported", "auto, float32, bfloat16, float16"]),
    (["--methods", "plain,eagle"], ["unknown method 'eagle'", "choose from: plain"]),
    (["--bench", "mt_bench,mmlu"], ["unknown prompt set(s) ['mmlu']", "choose from: mt_bench"]),
    (["--drafter", "{tmp}/nowhere"], ["nowhere does not exist", "OUTPUT_DIR/drafter"]),
    (["--drafter", "{file}"], ["is a file, not a drafter folder"]),
    (["--drafter", "eagle1="], ["--drafter 'eagle1=' names no folder", "LABEL=DIR"]),
    (["--drafter", "{tmp}", "--methods", "drafter_lookup", "--lookup-max-ngram", "2"],
     ["--hybrid-min-ngram 3 exceeds --lookup-max-ngram 2", "lower the one or raise the other"]),
])
def test_bad_options_are_refused_before_any_model_loads(tmp_path, drafter_file, args, phrases):
    out = tmp_path / "eval"
    args = [a.format(tmp=tmp_path, file=drafter_file) for a in args]
    result = run_cli(["eval", "--target", str(tmp_path / "no-target"), *args, "--out", str(out)])
    assert_refused(result, *phrases)  # the target does not exist: no model was loaded first
    assert not out.exists()


def test_a_short_lookup_ngram_alone_needs_no_hybrid_setting():
    from draftsmith.eval.config import build_eval_config
    from draftsmith.eval.settings import DecodeSettings

    config = build_eval_config(settings=DecodeSettings(lookup_max_ngram=2),
                               methods=("plain", "prompt_lookup"))
    assert config.settings.lookup_max_ngram == 2
