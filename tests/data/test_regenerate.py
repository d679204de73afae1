"""Regeneration by a tiny target: every assistant turn rewritten, sharded, and resumable after a
kill without redoing or duplicating conversations."""

import json

import pytest

from draftsmith.data.config import RegenerateConfig
from draftsmith.data.conversations import Conversation
from draftsmith.data.regenerate import regenerate
from draftsmith.data.render import resolve_chat_template
from draftsmith.data.sources import load_conversations
from draftsmith.errors import DraftsmithError
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer

EOS = [1]


def conversations(n=10):
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": "Be brief."}] if i % 4 == 0 else []
        for turn in range(1 + i % 2):
            messages += [{"role": "user", "content": f"Question {i}.{turn}?"},
                         {"role": "assistant", "content": f"Original answer {i}.{turn}"}]
        out.append(Conversation(f"c{i}", tuple(messages)))
    return out


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama"), char_tokenizer()


def run(target, folder, settings, **kwargs):
    model, tokenizer = target
    return regenerate(model, tokenizer, conversations(), folder,
                      template=resolve_chat_template(tokenizer), settings=settings,
                      max_length=400, eos_ids=EOS, progress=False, **kwargs)


def shard_files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.glob("shard-*.jsonl"))}


def shard_entries(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    return [{k: v for k, v in s.items() if k != "seconds"} for s in manifest["shards"]]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_resumed_run_writes_the_same_shards(target, tmp_path, temperature):
    settings = RegenerateConfig(max_new_tokens=6, temperature=temperature, batch_size=3,
                                shard_size=4)
    full = run(target, tmp_path / "full", settings)
    assert full.complete and full.shards_written == 3 and full.new_tokens > 0

    part = tmp_path / "part"
    first = run(target, part, settings, stop_after_shards=1)
    assert not first.complete and first.shards_written == 1
    # a kill mid-shard leaves a temp file and maybe an unrecorded shard: both are redone
    (part / ".shard-00001.jsonl.tmp").write_text("half a line")
    (part / "shard-00002.jsonl").write_text("written but never recorded\n")
    second = run(target, part, settings)
    assert second.complete and second.shards_skipped == 1 and second.shards_written == 2
    assert shard_files(part) == shard_files(tmp_path / "full")
    assert shard_entries(part) == shard_entries(tmp_path / "full")
    again = run(target, part, settings)
    assert again.shards_written == 0 and again.shards_skipped == 3


def test_every_assistant_turn_is_rewritten(target, tmp_path):
    settings = RegenerateConfig(max_new_tokens=5, batch_size=4, shard_size=16)
    run(target, tmp_path, settings)
    records = [json.loads(line) for line in (tmp_path / "shard-00000.jsonl").read_text().splitlines()]
    source = {c.id: c for c in conversations()}
    for record in records:
        original = source[record["id"]]
        messages = record["messages"]
        assert (messages[0]["role"] == "system") == (original.system is not None)
        users = [m["content"] for m in messages if m["role"] == "user"]
        assert users == original.user_turns[: len(users)]
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        assert answers and not any(a.startswith("Original answer") for a in answers)
        assert len(record["stops"]) == len(answers)
        assert set(record["stops"]) <= {"eos", "max_new_tokens"}
    # the folder is itself a conversation source, in index order
    loaded, stats = load_conversations(str(tmp_path))
    assert [c.id for c in loaded] == [r["id"] for r in records] and stats.kept == len(records)


def test_resume_with_other_settings_is_refused(target, tmp_path):
    run(target, tmp_path, RegenerateConfig(max_new_tokens=4, shard_size=4), stop_after_shards=1)
    with pytest.raises(DraftsmithError, match=r"other settings.*generation"):
        run(target, tmp_path, RegenerateConfig(max_new_tokens=8, shard_size=4))


def test_time_budget_stops_at_the_same_shard_and_keeps_the_rest(target, tmp_path, monkeypatch):
    """data.regenerate.max_minutes: shards stop once the finished ones took the budget (faked
    clock, 60 s a shard, 1.5 minutes: two shards of 4); a rerun writes nothing more."""
    import draftsmith.data.regenerate as regenerate_module

    clock = iter(range(0, 100_000, 60))  # each reading 60 s later: a shard takes >= 60 s
    monkeypatch.setattr(regenerate_module.time, "perf_counter", lambda: next(clock))
    settings = RegenerateConfig(max_new_tokens=4, batch_size=4, shard_size=4, max_minutes=1.5)
    report = run(target, tmp_path, settings)
    assert report.budget_reached and report.complete and report.shards_written == 2
    assert run(target, tmp_path, settings).shards_written == 0


def test_time_budget_ends_within_half_a_shard_of_it(target, tmp_path, monkeypatch):
    """data.regenerate.max_minutes=1.6 (96 s) with 30 s shards: the fourth shard would end at
    120 s, 24 s past the budget, more than half of itself, so the run ends after three, at 90 s
    (within 10% of the budget; stopping only once the budget was spent ended at 120 s)."""
    import draftsmith.data.regenerate as regenerate_module

    clock = iter(range(0, 100_000, 30))  # each reading 30 s later: a shard takes 30 s
    monkeypatch.setattr(regenerate_module.time, "perf_counter", lambda: next(clock))
    settings = RegenerateConfig(max_new_tokens=4, batch_size=4, shard_size=2, max_minutes=1.6)
    report = run(target, tmp_path, settings)
    assert report.budget_reached and report.shards_written == 3 and report.seconds == 90
    assert abs(report.seconds - 96) <= 0.1 * 96


def test_each_skipped_conversation_is_counted_once_by_its_reason():
    from draftsmith.data.regeneration_turns import regenerate_shard
    from draftsmith.data.server_client import Reply

    tokenizer = char_tokenizer()
    long = "x" * 300
    convs = [Conversation("long", ({"role": "user", "content": long},
                                   {"role": "assistant", "content": "a"})),
             Conversation("empty", ({"role": "user", "content": "Say nothing."},
                                    {"role": "assistant", "content": "a"})),
             Conversation("two", ({"role": "user", "content": "Hi."},
                                  {"role": "assistant", "content": "a"},
                                  {"role": "user", "content": long},
                                  {"role": "assistant", "content": "b"}))]

    def respond(requests):
        return [Reply(text="" if "nothing" in messages[-1]["content"] else "Hello.", tokens=2)
                for _, messages, _ in requests]

    records, _, dropped, failures = regenerate_shard(
        respond, tokenizer, convs, 0, template=resolve_chat_template(tokenizer), max_length=200)
    assert [r["id"] for r in records] == ["two"] and not failures
    assert dict(dropped) == {"prompt reached max_length": 1, "empty answer": 1,
                             "later turns cut (prompt reached max_length), conversation kept": 1}
