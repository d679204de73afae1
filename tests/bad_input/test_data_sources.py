"""`data run` on a source with no conversations, and damaged JSON sources, are clear errors
(issue #18); a JSON array truncated at its end is still salvaged."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from draftsmith.data.sources import load_conversations
from draftsmith.errors import DraftsmithError

RECORDS = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"Question {i}?"},
                                            {"from": "gpt", "value": "An answer."}]}
           for i in range(5)]


@pytest.mark.slow
def test_data_run_on_an_empty_source_fails_and_writes_nothing(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    recipe = {"target": {"name": "smollm2-135m-instruct", "dtype": "float32"},
              "data": {"source": str(tmp_path / "empty.jsonl"), "out_dir": str(tmp_path / "out")}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = subprocess.run([sys.executable, "-m", "draftsmith", "data", "run", "--config",
                             str(tmp_path / "recipe.yaml"), "--no-progress"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("draftsmith: error")]
    assert len(errors) == 1 and "gave no usable conversations" in errors[0], result.stderr
    assert not (tmp_path / "out" / "summary.json").exists()
    assert not (tmp_path / "out" / "tokenized.jsonl").exists()


def test_damaged_json_sources_are_errors_but_a_truncated_tail_is_salvaged(tmp_path):
    text = json.dumps(RECORDS, indent=2)
    truncated = tmp_path / "truncated.json"
    truncated.write_text(text[: text.index('"r4"') + 20])  # ends inside the last record
    assert [c.id for c in load_conversations(str(truncated))[0]] == ["r0", "r1", "r2", "r3"]

    broken = tmp_path / "broken.json"  # a syntax error in record 2, whole records after it
    broken.write_text(text.replace('"id": "r1",', '"id": "r1"', 1))
    with pytest.raises(DraftsmithError, match=r"broken.json: JSON syntax error at line 1\d column "
                                              r"\d+ \(char [\d,]+\): Expecting ',' delimiter .*"
                                              "damaged, not truncated"):
        load_conversations(str(broken))
    missing_comma = tmp_path / "missing_comma.json"
    missing_comma.write_text(text.replace("},\n  {", "}\n  {", 1))
    with pytest.raises(DraftsmithError, match="expected ',' or ']' after element 1"):
        load_conversations(str(missing_comma))

    wrapped = tmp_path / "wrapped.json"  # the list inside an object
    wrapped.write_text(json.dumps({"version": 1, "data": RECORDS}))
    with pytest.raises(DraftsmithError, match=r"holds one JSON object \(keys: version, data\), "
                                              "not a list of conversations"):
        load_conversations(str(wrapped))
    single = tmp_path / "single.json"  # one record on its own still reads as one record
    single.write_text(json.dumps(RECORDS[0]))
    assert len(load_conversations(str(single))[0]) == 1
