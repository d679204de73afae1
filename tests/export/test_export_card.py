"""The model card: Hub front matter, training facts from the checkpoint metadata, results read from
an eval.json (never typed), "not evaluated" without one, serving snippets per format."""

from __future__ import annotations

import json

import pytest
import yaml

from draftsmith.errors import DraftsmithError
from draftsmith.export import export_drafter
from tests.helpers.export_helpers import make_checkpoint


def eval_payload(kind: str = "eagle3", training_steps: int = 7) -> dict:
    """Shaped like the eval.json `draftsmith eval --drafter` writes (eval/evaluate.py)."""
    row = {"runs": 2, "new_tokens": 64, "seconds": 4.0, "tokens_per_second": 16.0,
           "tau": 2.3456, "acceptance_by_depth": [0.81, 0.52, float("nan")],
           "speedup": 1.6789, "identical_to_plain": 1.0}
    plain = {**row, "tau": 1.0, "speedup": 1.0, "acceptance_by_depth": []}
    return {
        "config": {"dtype": "bfloat16", "limit": 2, "max_new_tokens": 32,
                   "sampling": {"temperature": 0.0}},
        "hardware": "Test CPU, 2 threads", "date": "2026-01-02T03:04:05+00:00", "commit": "abc1234",
        "drafters": {"": {"kind": kind, "path": "runs/x/drafter", "training_steps": training_steps,
                         "target": "test-org/tiny-target"}},
        "summary": {"mt_bench": {"plain": plain, "drafter": row},
                    "all": {"plain": plain, "drafter": {**row, "tau": 3.21}}},
    }


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def write_eval(tmp_path, payload) -> str:
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(payload))
    return str(path)


def test_card_reads_results_from_eval_json(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle3")
    out = export_drafter(folder, "speculators", tmp_path / "export",
                         eval_json=write_eval(tmp_path, eval_payload()))
    card = (out / "README.md").read_text()
    assert front_matter(card) == {"library_name": "speculators",
                                  "base_model": "test-org/tiny-target",
                                  "tags": ["speculative-decoding", "draftsmith", "eagle3",
                                           "speculators"]}
    assert "| mt_bench | drafter | 2.35 | 1.68x | 16.0 | 0.81, 0.52, n/a | 100% |" in card
    assert "| all | drafter | 3.21 |" in card
    assert "Test CPU, 2 threads" in card and "2026-01-02T03:04:05+00:00" in card
    assert "Not evaluated" not in card
    assert "| Training steps | 7 (1 process(es)) |" in card
    assert "source sharegpt; limit 8" in card and "lr 0.0001" in card
    assert "Aux layers | [0, 1, 2]" in card and "Draft vocab | 100 of 128 tokens" in card
    assert "vllm serve test-org/tiny-target --speculative-config" in card
    assert '"method": "eagle3"' in card and "--format eagle3` for SGLang" in card


@pytest.mark.parametrize(("kind", "fmt", "engine_line"), [
    ("eagle3", "eagle3", "--speculative-algorithm EAGLE3"),
    ("eagle1", "eagle", '"method": "eagle"'),
    ("medusa", "medusa", '"method": "medusa"'),
    ("mtp", "mtp", "native MTP support"),
])
def test_card_without_eval_says_not_evaluated(tmp_path, kind, fmt, engine_line):
    _, _, folder = make_checkpoint(tmp_path, kind)
    card = (export_drafter(folder, fmt, tmp_path / "export") / "README.md").read_text()
    assert "Not evaluated" in card and "| drafter |" not in card
    assert engine_line in card
    assert front_matter(card)["library_name"] == "draftsmith"
    assert "## Training recipe" in card and "`config.json`" in card


@pytest.mark.parametrize(("payload", "message"), [
    (eval_payload(kind="medusa"), "kind='medusa' but this checkpoint has kind='eagle3'"),
    (eval_payload(training_steps=99), "training_steps=99 but this checkpoint has training_steps=7"),
    ({**eval_payload(), "drafters": {}}, "has no drafter results"),
])
def test_eval_json_of_another_drafter_is_refused(tmp_path, payload, message):
    _, _, folder = make_checkpoint(tmp_path, "eagle3")
    with pytest.raises(DraftsmithError, match=message):
        export_drafter(folder, "eagle3", tmp_path / "export",
                       eval_json=write_eval(tmp_path, payload))
    assert not (tmp_path / "export").exists()


def test_card_picks_its_drafter_from_a_multi_drafter_eval(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle3")
    payload = eval_payload()
    row = payload["summary"]["mt_bench"]["drafter"]
    other = {**row, "tau": 1.11}
    payload["drafters"] = {"eagle3": payload["drafters"][""],
                           "medusa1": {**payload["drafters"][""], "kind": "medusa"}}
    hybrid = {**row, "tau": 2.99}  # the prompt-lookup hybrid: draftsmith's loop, not an engine's
    payload["summary"] = {"mt_bench": {"plain": payload["summary"]["mt_bench"]["plain"],
                                       "drafter_dynamic@eagle3": row, "drafter@medusa1": other,
                                       "drafter_lookup@eagle3": hybrid}}
    out = export_drafter(folder, "eagle3", tmp_path / "export",
                         eval_json=write_eval(tmp_path, payload))
    card = (out / "README.md").read_text()
    assert "| mt_bench | drafter_dynamic | 2.35 |" in card
    assert "1.11" not in card and "@" not in card.split("## ")[1]
    assert "2.99" not in card and "drafter_lookup" not in card
