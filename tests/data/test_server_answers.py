"""What regeneration says about a server's answers, against real HTTP servers on loopback: the API
key never appears in a message, a reply's error or a file, even when the server echoes the
Authorization header back; a URL that does not serve an OpenAI-compatible API is named as such,
with the base_url it should be, and no offer to resume."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from draftsmith.data.config import RegenerateConfig
from draftsmith.data.conversations import Conversation
from draftsmith.data.regenerate import regenerate
from draftsmith.data.render import resolve_chat_template
from draftsmith.data.server_check import check_serves_target
from draftsmith.data.server_client import API_KEY_ENV, ChatServer, ServerUnavailable
from draftsmith.errors import DraftsmithError
from tests.helpers.tiny_targets import tiny_target
from tests.helpers.tiny_tokenizers import char_tokenizer

KEY = "sk-draftsmith-test-4f9c2e71b0d8a6"
HI = [{"role": "user", "content": "hi"}]


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers every request with `status`, its body echoing the Authorization header."""

    status = 401

    def do_GET(self):
        self._answer()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self):
        echoed = f"bad request; you sent Authorization: {self.headers.get('Authorization')}"
        body = json.dumps({"error": {"message": echoed, "type": "invalid_request_error"}}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Echo400(_Echo):
    status = 400


class _Echo500(_Echo):
    status = 500


class _NotFoundPage(_Echo):
    """A web server that is not an inference server: 404 on every route, HTML body."""

    def _answer(self):
        body = b"<html><body><h1>404 Not Found</h1></body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _FastApiNotFound(_Echo):
    """vLLM or SGLang asked without /v1: FastAPI's own 404 body."""

    status = 404

    def _answer(self):
        body = b'{"detail":"Not Found"}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _HtmlOk(_Echo):
    """A web page answered 200 on every route."""

    def _answer(self):
        body = b"<html><body>welcome</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def http_server(request):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    return KEY


def ask(server: ChatServer):
    return server.complete(0, HI, [], max_tokens=4, temperature=0.0, top_p=1.0, seed=None)


@pytest.mark.parametrize("http_server", [_Echo], indirect=True)
def test_refused_key_echoed_by_the_server_is_scrubbed(http_server, api_key):
    for call in (lambda: ChatServer([http_server], retries=0, timeout=5),  # lists the models
                 lambda: ask(ChatServer([http_server], model="m", retries=0, timeout=5))):
        with pytest.raises(DraftsmithError) as err:
            call()
        message = str(err.value)
        assert api_key not in message and "Bearer ***" in message
        assert "refused the API key (HTTP 401" in message and API_KEY_ENV in message


@pytest.mark.parametrize("http_server", [_Echo500], indirect=True)
def test_server_error_echoing_the_key_is_scrubbed(http_server, api_key):
    with pytest.raises(ServerUnavailable, match=r"answered 500 after 0 retries") as err:
        ask(ChatServer([http_server], model="m", retries=0, timeout=5))
    assert api_key not in str(err.value) and "Bearer ***" in str(err.value)


@pytest.mark.parametrize("http_server", [_Echo400], indirect=True)
def test_refused_request_echoing_the_key_reaches_no_file(http_server, api_key, tmp_path):
    server = ChatServer([http_server], model="m", retries=0, timeout=5)
    reply = ask(server)
    assert reply.error.startswith("400: ") and api_key not in reply.error
    assert "Bearer ***" in reply.error
    tokenizer = char_tokenizer()
    with pytest.raises(DraftsmithError, match="refused a probe request") as err:
        check_serves_target(server, tiny_target("llama"), tokenizer,
                            resolve_chat_template(tokenizer), "tiny")
    assert api_key not in str(err.value)
    conversations = [Conversation(f"c{i}", ({"role": "user", "content": f"question {i}"},
                                            {"role": "assistant", "content": "answer"}))
                     for i in range(3)]
    report = regenerate(tiny_target("llama"), tokenizer, conversations, tmp_path / "out",
                        template=resolve_chat_template(tokenizer),
                        settings=RegenerateConfig(backend="openai", base_url=http_server,
                                                  max_new_tokens=4, retries=0, shard_size=2),
                        max_length=256, eos_ids=[tokenizer.eos_token_id], progress=False,
                        server=server)
    assert len(report.failed) == 3 and all(api_key not in f["error"] for f in report.failed)
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert written and not any(api_key in p.read_text() for p in written)


def test_password_in_a_base_url_is_not_shown():
    with pytest.raises(ServerUnavailable, match=r"could not be reached") as err:
        ChatServer(["http://user:hunter2-secret@127.0.0.1:9/v1"], retries=0, timeout=5)
    assert "hunter2-secret" not in str(err.value) and "user:***@127.0.0.1:9" in str(err.value)


@pytest.mark.parametrize("http_server", [_NotFoundPage, _FastApiNotFound, _HtmlOk], indirect=True)
def test_url_without_an_openai_api_says_so_and_how_base_url_looks(http_server):
    tokenizer = char_tokenizer()
    calls = {
        "GET {}/models": lambda: ChatServer([http_server], retries=0, timeout=5),
        "POST {}/chat/completions": lambda: ask(ChatServer([http_server], model="m", retries=0,
                                                           timeout=5)),
        "POST {}/completions": lambda: ChatServer([http_server], model="m", retries=0, timeout=5,
                                                  endpoint="completions").complete(
            0, HI, [1, 2, 3], max_tokens=4, temperature=0.0, top_p=1.0, seed=None),
        "POST {}/chat/completions ": lambda: check_serves_target(  # the check's first request
            ChatServer([http_server], model="m", retries=0, timeout=5), tiny_target("llama"),
            tokenizer, resolve_chat_template(tokenizer), "tiny"),
    }
    for probe, call in calls.items():
        with pytest.raises(DraftsmithError) as err:
            call()
        message = str(err.value)
        assert not isinstance(err.value, ServerUnavailable)
        assert f"the server at {http_server} does not serve an OpenAI-compatible API" in message
        assert f"{probe.strip().format(http_server)} answered " in message
        assert "ending in /v1 (e.g. http://127.0.0.1:8000/v1" in message
        assert "resume" not in message


class _UnknownModel(_Echo):
    """vLLM's answer for a model name it does not serve."""

    def _answer(self):
        body = json.dumps({"error": {"message": "The model `m` does not exist.",
                                     "type": "NotFoundError", "code": 404}}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("http_server", [_UnknownModel], indirect=True)
def test_model_the_server_does_not_serve_names_the_setting(http_server):
    with pytest.raises(DraftsmithError, match=r"does not serve model 'm' \(The model `m` does not "
                                              r"exist\.\); set data\.regenerate\.model") as err:
        ask(ChatServer([http_server], model="m", retries=0, timeout=5))
    assert not isinstance(err.value, ServerUnavailable)


class _Minimal(_Echo):
    """The least an OpenAI-compatible server answers; its /tokenize is a web page."""

    def _answer(self):
        if self.path == "/v1/models":
            payload = {"object": "list", "data": [{"id": "tiny", "object": "model",
                                                   "created": 0, "owned_by": "test"}]}
        elif self.path == "/v1/chat/completions":
            payload = {"id": "c", "object": "chat.completion", "created": 0, "model": "tiny",
                       "choices": [{"index": 0, "finish_reason": "length", "message": {
                           "role": "assistant", "content": "Hello there"}}],
                       "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}}
        else:
            body = b"<html>no such route</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("http_server", [_Minimal], indirect=True)
def test_an_openai_compatible_answer_is_read(http_server, api_key):
    server = ChatServer([http_server], retries=0, timeout=5)
    assert server.model == "tiny"
    reply = ask(server)
    assert (reply.text, reply.stop, reply.tokens, reply.error) == ("Hello there",
                                                                   "max_new_tokens", 4, None)
    assert server.prompt_tokens(HI) == 7
    assert server.tokenize("hi") is None  # a page, not token ids: the check skips that step
