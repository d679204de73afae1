"""Regeneration through a real server process on loopback: llama.cpp's server (started by
draftsmith on SmolLM2's GGUF) answers multi-turn conversations; a server killed mid-run loses
nothing on resume; a wrong URL, a server that answers 500 or hangs, and a server of another model
are each one clear error."""

import http.server
import json
import os
import signal
import threading
import time

import pytest

from draftsmith.data.config import RegenerateConfig
from draftsmith.data.conversations import Conversation
from draftsmith.data.regenerate import regenerate
from draftsmith.data.render import render_messages, resolve_chat_template
from draftsmith.data.server_check import check_serves_target
from draftsmith.data.server_client import ChatServer, ServerUnavailable
from draftsmith.errors import DraftsmithError
from draftsmith.llama_cpp.server import LlamaCppServer
from draftsmith.target.offline_models import gguf_path
from tests.helpers.state import require_offline_model
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer

pytestmark = pytest.mark.slow
NAME = "smollm2-135m-instruct"


def conversations(n=6):
    out = []
    for i in range(n):
        messages = []
        for turn in range(1 + i % 2):
            messages += [{"role": "user", "content": f"Name {turn + 2} fruits that are {i} letters long."},
                         {"role": "assistant", "content": "Original answer."}]
        out.append(Conversation(f"c{i}", tuple(messages)))
    return out


@pytest.fixture(scope="module")
def target():
    from draftsmith.target.load import load_target

    loaded = load_target(require_offline_model(NAME), dtype="float32")
    return loaded, resolve_chat_template(loaded.tokenizer)


def serve(**kwargs):
    return LlamaCppServer(gguf_path(NAME), parallel=4, ctx_per_slot=1024, alias=NAME, **kwargs)


@pytest.fixture(scope="module")
def server_url(target, tmp_path_factory):
    with serve(log_path=tmp_path_factory.mktemp("server") / "server.log") as server:
        yield server.base_url


def settings(**overrides):
    values = dict(backend="openai", base_url="http://unused/v1", max_new_tokens=12,
                  shard_size=2, concurrency=4, retries=0, request_timeout=60)
    return RegenerateConfig(**(values | overrides))


def run(target, folder, server, convs=None, **kwargs):
    loaded, template = target
    return regenerate(loaded.model, loaded.tokenizer, convs or conversations(), folder,
                      template=template, settings=kwargs.pop("config", settings()),
                      max_length=512, eos_ids=loaded.eos_token_ids, progress=False,
                      server=server, **kwargs)


def records(folder):
    return [json.loads(line) for p in sorted(folder.glob("shard-*.jsonl"))
            for line in p.read_text().splitlines()]


def test_multi_turn_answers_come_from_the_server(target, server_url, tmp_path):
    loaded, template = target
    server = ChatServer([server_url], endpoint="chat", retries=0)
    assert server.model == NAME
    check = check_serves_target(server, loaded.model, loaded.tokenizer, template, NAME)
    assert check["tokenizer"] == "same ids" and check["greedy_agreement"] >= 0.8
    report = run(target, tmp_path / "out", server)
    assert report.complete and report.new_tokens > 0 and not report.failed
    out = records(tmp_path / "out")
    assert [r["index"] for r in out] == list(range(6))
    first_question = conversations()[1].messages[0]
    direct = server.complete(0, [first_question], [], max_tokens=12, temperature=0.0, top_p=1.0,
                             seed=None)
    two_turn = out[1]["messages"]
    assert [m["role"] for m in two_turn] == ["user", "assistant", "user", "assistant"]
    assert two_turn[1]["content"] == direct.text.strip() != "Original answer."
    for record in out:  # every answer cut at 12 tokens is marked, and trains no end-of-turn
        answers = [m for m in record["messages"] if m["role"] == "assistant"]
        assert [bool(m.get("cut")) for m in answers] == [s == "max_new_tokens" for s in record["stops"]]
    cut = next((r for r in out if "max_new_tokens" in r["stops"]), None)
    assert cut, "the test prompts should cut at least one answer at 12 tokens"
    ids, mask = render_messages(loaded.tokenizer, cut["messages"], template)
    trained_ends = sum(m and t in loaded.eos_token_ids for t, m in zip(ids, mask, strict=True))
    assert trained_ends == cut["stops"].count("eos")


def test_completions_endpoint_sends_the_targets_own_prompt(target, server_url, tmp_path):
    loaded, template = target
    server = ChatServer([server_url], endpoint="completions", retries=0)
    check_serves_target(server, loaded.model, loaded.tokenizer, template, NAME)
    report = run(target, tmp_path / "out", server, convs=conversations(2),
                 config=settings(endpoint="completions"))
    assert report.complete and len(records(tmp_path / "out")) == 2


class KilledOnFirstRequest(ChatServer):
    """A client whose first request kills its server first (SIGKILL, no graceful drain): the run
    fails while its next shard is in flight, however fast or slow the machine (a timed kill raced
    the server: a loaded CI machine's answers were all in before it)."""

    def __init__(self, process, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.process, self.first = process, threading.Lock()

    def complete(self, *args, **kwargs):
        if self.first.acquire(blocking=False):  # the shard's requests go out together
            os.killpg(self.process.process.pid, signal.SIGKILL)  # its own process group
            self.process.process.wait()
        return super().complete(*args, **kwargs)


def test_killed_server_then_resume_loses_nothing(target, tmp_path):
    folder = tmp_path / "out"
    with serve(log_path=tmp_path / "a.log") as local:
        first = run(target, folder, ChatServer([local.base_url], retries=0, timeout=30),
                    stop_after_shards=1)
        assert first.shards_written == 1
        holder = {"error": _raises(lambda: run(target, folder, KilledOnFirstRequest(
            local, [local.base_url], retries=0, timeout=30)))}
    assert isinstance(holder["error"], ServerUnavailable), holder
    assert "Finished shards are kept" in str(holder["error"])
    with serve(log_path=tmp_path / "b.log") as local:
        resumed = run(target, folder, ChatServer([local.base_url], retries=0))
    assert resumed.complete
    indices = [r["index"] for r in records(folder)]
    assert indices == list(range(6))  # every conversation once: none lost, none twice


    def no_server():
        raise AssertionError("a finished run opened a server")

    again = run(target, folder, no_server)  # a finished run starts no server at all
    assert again.complete and again.shards_written == 0


def test_recipe_with_a_local_server_resumes_without_starting_one(tmp_path):
    from draftsmith.data.config import DataConfig, DataRecipe
    from draftsmith.data.pipeline import run_data_recipe
    from draftsmith.target.load import TargetSpec

    rows = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"Count to {i + 2}."},
                                              {"from": "gpt", "value": "Original."}]}
            for i in range(3)]
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = DataConfig(source=str(tmp_path / "chats.jsonl"), out_dir=str(tmp_path / "data"),
                      max_length=256, regenerate=settings(base_url="local", concurrency=2))
    recipe = DataRecipe(TargetSpec(name=require_offline_model(NAME), dtype="float32"), data)
    first_log, again_log = [], []
    first = run_data_recipe(recipe, progress=False, log=first_log.append)
    assert first["regeneration"]["complete"] and first["regeneration"]["conversations"] == 3
    assert any(line.startswith("llama.cpp server on") for line in first_log), first_log
    again = run_data_recipe(recipe, progress=False, log=again_log.append)
    assert not any(("server" in line and "serves" in line) or line.startswith("llama.cpp server")
                   for line in again_log), again_log  # finished: no engine started, no check
    assert again["regeneration"]["server"] == first["regeneration"]["server"]
    assert (tmp_path / "data" / "tokenized.jsonl").read_text().count("\n") == 3


def _raises(call):
    try:
        call()
    except Exception as err:
        return err
    return None


def test_nothing_listening_is_one_clear_error():
    with pytest.raises(DraftsmithError, match=r"could not be reached; check data\.regenerate\.base_url"):
        ChatServer(["http://127.0.0.1:9/v1"], retries=0, timeout=5)


class _Answer500(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self._fail()

    def do_POST(self):
        self._fail()

    def _fail(self):
        body = json.dumps({"error": {"message": "out of memory in the test server"}}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Hang(_Answer500):
    def _fail(self):
        time.sleep(3)


@pytest.fixture
def http_server(request):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


@pytest.mark.parametrize("http_server", [_Answer500], indirect=True)
def test_server_answering_500_is_one_clear_error(http_server):
    with pytest.raises(ServerUnavailable, match=r"answered 500 after 1 retries: out of memory"):
        ChatServer([http_server], model="m", retries=1, timeout=5).complete(
            0, [{"role": "user", "content": "hi"}], [], max_tokens=4, temperature=0.0, top_p=1.0,
            seed=None)


@pytest.mark.parametrize("http_server", [_Hang], indirect=True)
def test_server_timing_out_is_one_clear_error(http_server):
    with pytest.raises(ServerUnavailable, match=r"did not answer within 1 s.*request_timeout"):
        ChatServer([http_server], model="m", retries=0, timeout=1).complete(
            0, [{"role": "user", "content": "hi"}], [], max_tokens=4, temperature=0.0, top_p=1.0,
            seed=None)


def test_server_of_another_tokenizer_is_refused(server_url):
    tokenizer = char_tokenizer()
    server = ChatServer([server_url], retries=0)
    with pytest.raises(DraftsmithError, match="tokenizes differently from the target tiny"):
        check_serves_target(server, tiny_target("llama"), tokenizer,
                            resolve_chat_template(tokenizer), "tiny")


def test_server_of_other_weights_is_refused(target, server_url):
    loaded, template = target
    other = tiny_target("llama", vocab_size=len(loaded.tokenizer))
    server = ChatServer([server_url], retries=0)
    with pytest.raises(DraftsmithError, match=r"answers unlike the target other.*serves another model"):
        check_serves_target(server, other, loaded.tokenizer, template, "other")
