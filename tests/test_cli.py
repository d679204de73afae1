"""The command line: every verb listed, clear errors for verbs that have not landed yet."""

import subprocess
import sys

from draftsmith.cli import main

VERBS = ("models", "generate", "machine", "data", "train", "eval", "export", "push", "bench",
         "plan")


def test_help_lists_every_verb():
    result = subprocess.run([sys.executable, "-m", "draftsmith", "--help"],
                            capture_output=True, text=True, check=True)
    # each verb has its own line in the verb list (a word of the description would not count)
    listed = {line.split()[0] for line in result.stdout.splitlines()
              if line.startswith("    ") and line.split() and not line.startswith("     ")}
    assert set(VERBS) <= listed, f"missing from --help: {sorted(set(VERBS) - listed)}"


def test_models_list_names_the_catalog(capsys):
    assert main(["models", "list"]) == 0
    assert "smollm2-135m-instruct" in capsys.readouterr().out


def test_unknown_model_is_a_clean_error(capsys):
    assert main(["models", "fetch", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "unknown offline model" in err and "Traceback" not in err


def test_baselines_add_each_drafter_with_prompt_lookup(tmp_path, monkeypatch):
    """`--baselines` with named drafters adds `drafter_lookup@LABEL` for each, next to the
    training-free baselines, each method once."""
    import draftsmith.eval.evaluate as evaluate

    seen = {}
    monkeypatch.setattr(evaluate, "run_eval", lambda config, log=print: seen.setdefault(
        "methods", config.methods))
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
    assert main(["eval", "--drafter", f"a={tmp_path / 'a'}", "--drafter", f"b={tmp_path / 'b'}",
                 "--baselines", "--out", str(tmp_path / "out")]) == 0
    assert seen["methods"] == ("plain", "prompt_lookup", "drafter@a", "drafter@b", "lookahead",
                               "hf_generate", "hf_prompt_lookup", "drafter_lookup@a",
                               "drafter_lookup@b")
