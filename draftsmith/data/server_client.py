"""Answers from an OpenAI-compatible inference server (vLLM, SGLang, llama.cpp's server, TGI),
for regeneration: requests spread over one or more base URLs, many at once, retried with backoff by
the `openai` client, and a check that the server serves the target before anything is generated.

Two endpoints: `chat` sends the conversation's messages (the server applies its own chat
template; the check below proves it renders them as the target's template does); `completions`
sends the token ids of the target's own rendering, so the server sees exactly the prompt the
in-process path would. Either way an answer comes back as text with its finish reason: `stop` is
an answer that ended at the end-of-turn token, `length` one cut at `max_tokens`.

A request the server refuses (4xx, e.g. a prompt over its context) fails that conversation alone
and is listed with its error; a server that is down, times out or answers 5xx after every retry
stops the run with one error (finished shards are kept, so a rerun resumes). A URL that serves no
OpenAI-compatible API (404/405 on its routes, a web page instead of JSON), a refused API key or a
model the server does not serve stops it with one error naming the setting to fix. No message
built from an answer shows the API key: a server may echo the Authorization header.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from draftsmith.errors import DraftsmithError

API_KEY_ENV = "DRAFTSMITH_SERVER_API_KEY"  # read from the environment only; never stored
PROBE = [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "Write one sentence about the sea, then count to five."}]
AGREEMENT_PROMPTS = ("Explain in two sentences why the sky is blue.",
                     "Write a Python function that returns the factorial of n.",
                     "List three facts about the planet Mars.")


@dataclass
class Reply:
    """One answer: its text, whether it ended at EOS or at the cap, or the request's error."""

    text: str = ""
    stop: str = "eos"  # eos | max_new_tokens
    tokens: int = 0  # completion tokens the server counted
    error: str | None = None


class ServerUnavailable(DraftsmithError):
    """The server is down, timed out, or failed every retry: the run stops (and can resume)."""


class RequestRefused(DraftsmithError):
    """The server refused one request (a 4xx such as a prompt over its context): that
    conversation fails alone, with `reply_error` as its listed error."""

    def __init__(self, message: str, reply_error: str):
        super().__init__(message)
        self.reply_error = reply_error


ROUTES = {"models": "GET {}/models", "chat": "POST {}/chat/completions",
          "completions": "POST {}/completions"}
BASE_URL_FIX = ("data.regenerate.base_url must be the root of the server's OpenAI API, ending in "
                "/v1 (e.g. http://127.0.0.1:8000/v1 for `vllm serve`, SGLang or llama.cpp's "
                "llama-server)")


def scrub_secrets(text: str, secrets: Sequence[str]) -> str:
    """`text` with every secret replaced by `***` (a server may echo the Authorization header)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


class ChatServer:
    """A client for one model served at one or more OpenAI-compatible base URLs.

    Every message built from a server's answer has the API key (and any password in a base URL)
    replaced by `***`, so neither reaches the terminal, a log or the run's manifest.

    Args:
        base_urls: URLs ending in `/v1`; request i goes to `base_urls[i % len(base_urls)]`.
        model: the served model name; None takes the only one the first server lists.
        endpoint: `chat` or `completions` (see the module docstring).
        concurrency: requests in flight at once over all servers.
        timeout: seconds per request.
        retries: retries per request (connection errors, timeouts, 408/409/429/5xx), with
            exponential backoff by the `openai` client.
        extra_body: fields passed through in every request (e.g. `chat_template_kwargs`).

    Raises:
        DraftsmithError: (model None) the first server lists no model or several, or does not
            serve an OpenAI-compatible API; ServerUnavailable when it is down.
    """

    def __init__(self, base_urls: Sequence[str], model: str | None = None, *,
                 endpoint: str = "chat", concurrency: int = 16, timeout: float = 600.0,
                 retries: int = 3, extra_body: dict | None = None):
        from openai import OpenAI

        key = os.environ.get(API_KEY_ENV) or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.base_urls = list(base_urls)
        self.secrets = [s for s in (key, *(urlsplit(u).password for u in self.base_urls))
                        if s and s != "EMPTY"]
        self.clients = [OpenAI(base_url=url, api_key=key, timeout=timeout, max_retries=retries)
                        for url in self.base_urls]
        self.endpoint, self.concurrency = endpoint, concurrency
        self.timeout, self.retries = timeout, retries
        self.extra_body = dict(extra_body or {})
        self.model = model
        if model is None:
            self.model = self._only_model()

    def _only_model(self) -> str:
        served = self._call(0, "models", lambda client: [_text(m.id)
                                                         for m in client.models.list().data])
        if len(served) != 1:
            names = self.scrub(", ".join(served)[:300]) or "none"
            raise DraftsmithError(
                f"the server at {self.shown(0)} serves {len(served)} models ({names}); name one "
                "with data.regenerate.model")
        return served[0]

    def scrub(self, text: str) -> str:
        """`text` without the API key or a base URL's password (see `scrub_secrets`)."""
        return scrub_secrets(text, self.secrets)

    def shown(self, server: int) -> str:
        """Base URL `server`, as messages show it (a password in it replaced by `***`)."""
        return self.scrub(self.base_urls[server])

    def _call(self, server: int, route: str, call: Callable):
        """`call(client)` against server `server` on `route` (a key of ROUTES).

        Raises:
            RequestRefused: a 4xx refusal of this request alone.
            ServerUnavailable: down, timed out, or 408/429/5xx after every retry.
            DraftsmithError: the URL does not serve an OpenAI-compatible API, the key is
                refused, or the model is not served there.
        """
        import openai

        try:
            return call(self.clients[server])
        except openai.APIStatusError as err:
            raise self._status_error(server, route, err) from None
        except openai.APIConnectionError as err:  # timeouts included
            raise self._unavailable(server, err) from None
        except openai.APIError as err:  # e.g. a body the client could not validate
            raise self._not_openai(server, route, f"an answer the client rejected "
                                   f"({self.scrub(str(err))[:160]})") from None
        except (AttributeError, TypeError, KeyError, IndexError, ValueError):
            # the client returns what it could not parse as-is: text, a list, a dict without fields
            raise self._not_openai(server, route, "an answer that is not in the OpenAI "
                                   "format") from None

    def _status_error(self, server: int, route: str, err) -> DraftsmithError:
        status, message = err.status_code, self._message(err)
        url = self.shown(server)
        if status >= 500 or status in (408, 429):
            return self._unavailable(server, err)
        if status in (401, 403):
            return DraftsmithError(
                f"the server at {url} refused the API key (HTTP {status}: {message}); set "
                f"{API_KEY_ENV} to the key the server was started with")
        model_unknown = (route != "models" and "model" in message.lower()
                         and _is_openai_error(err.body))
        if status == 405 or (status == 404 and not model_unknown):
            return self._not_openai(server, route, f"HTTP {status} ({message or 'empty body'})")
        if status == 404:
            return DraftsmithError(
                f"the server at {url} does not serve model {self.model!r} ({message}); set "
                "data.regenerate.model to a model it lists at GET /v1/models, or leave it out "
                "when the server serves one model")
        return RequestRefused(f"the server at {url} refused {ROUTES[route].format(url)}: "
                              f"{status}: {message}", f"{status}: {message}")

    def _not_openai(self, server: int, route: str, answer: str) -> DraftsmithError:
        url = self.shown(server)
        return DraftsmithError(
            f"the server at {url} does not serve an OpenAI-compatible API: "
            f"{ROUTES[route].format(url.rstrip('/'))} answered {answer}. {BASE_URL_FIX}")

    def _unavailable(self, server: int, err: Exception) -> ServerUnavailable:
        import openai

        url = self.shown(server)
        if isinstance(err, openai.APITimeoutError):
            why = (f"did not answer within {self.timeout:g} s ({self.retries} retries); raise "
                   "data.regenerate.request_timeout or lower data.regenerate.concurrency")
        elif isinstance(err, openai.APIConnectionError):
            why = ("could not be reached; check data.regenerate.base_url (it ends in /v1, e.g. "
                   "http://127.0.0.1:8000/v1) and that the server is running")
        elif isinstance(err, openai.APIStatusError):
            why = f"answered {err.status_code} after {self.retries} retries: {self._message(err)}"
        else:
            why = f"failed: {type(err).__name__}: {self.scrub(str(err))[:300]}"
        return ServerUnavailable(f"the server at {url} {why}. Finished shards are kept; run "
                                 "again to resume")

    def _message(self, err) -> str:
        """The error message of a server's answer, scrubbed of secrets, then cut to 300 chars."""
        body = getattr(err, "body", None)
        if isinstance(body, dict):
            inner = body.get("error", body)
            if isinstance(inner, dict) and inner.get("message"):
                return " ".join(self.scrub(str(inner["message"])).split())[:300]
        text = body if isinstance(body, str) else str(err)
        return " ".join(self.scrub(text).split())[:300]

    def complete(self, server: int, messages: list[dict], prompt_ids: list[int], *,
                 max_tokens: int, temperature: float, top_p: float, seed: int | None) -> Reply:
        """One answer to `messages` (chat) or `prompt_ids` (completions), from server
        `server % len(base_urls)`; `seed` is sent when sampling. A 4xx refusal of this request
        comes back as `Reply.error`.

        Raises:
            ServerUnavailable, DraftsmithError: see `_call`.
        """
        server %= len(self.clients)
        sampling = dict(model=self.model, max_tokens=max_tokens, temperature=temperature,
                        top_p=top_p, extra_body=self.extra_body or None)
        if seed is not None and temperature > 0:
            sampling["seed"] = seed

        def ask(client) -> Reply:
            if self.endpoint == "chat":
                response = client.chat.completions.create(messages=messages, **sampling)
                text = response.choices[0].message.content or ""
            else:
                response = client.completions.create(prompt=prompt_ids, **sampling)
                text = response.choices[0].text or ""
            stop = "max_new_tokens" if response.choices[0].finish_reason == "length" else "eos"
            tokens = response.usage.completion_tokens if response.usage else 0
            return Reply(text=_text(text), stop=stop, tokens=int(tokens or 0))

        try:
            return self._call(server, self.endpoint, ask)
        except RequestRefused as err:
            return Reply(error=err.reply_error)

    def prompt_tokens(self, messages: list[dict]) -> int | None:
        """How many tokens the first server counts in the chat prompt of `messages` (one
        1-token greedy request); None where it reports no usage.

        Raises:
            DraftsmithError: see `_call` (a refusal included).
        """
        def ask(client) -> int | None:
            response = client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=1, temperature=0.0,
                extra_body=self.extra_body or None)
            return int(response.usage.prompt_tokens) if response.usage else None

        return self._call(0, "chat", ask)

    def complete_all(self, requests: Sequence[tuple[int, list[dict], list[int]]], *,
                     seed: int, **sampling) -> list[Reply]:
        """`complete` for every `(key, messages, prompt_ids)`, `concurrency` at a time, in order;
        request `key` is sent with seed `seed + key`; requests go round-robin over the servers.

        Raises:
            ServerUnavailable: the first one any request raised (the others are cancelled).
        """
        pool = ThreadPoolExecutor(max_workers=self.concurrency)
        try:
            futures = [pool.submit(self.complete, j, m, p, seed=seed + k, **sampling)
                       for j, (k, m, p) in enumerate(requests)]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def tokenize(self, text: str) -> list[int] | None:
        """The server's token ids of `text` (special tokens parsed, none added), from the
        `/tokenize` route llama.cpp, vLLM and SGLang offer; None where there is none."""
        import httpx

        root = self.base_urls[0].rstrip("/").removesuffix("/v1")
        body = {"content": text, "prompt": text, "model": self.model, "add_special": False,
                "add_special_tokens": False}
        try:
            response = httpx.post(f"{root}/tokenize", json=body, timeout=self.timeout)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            tokens = response.json().get("tokens")
            return [int(t["id"] if isinstance(t, dict) else t) for t in tokens]
        except (ValueError, TypeError, KeyError, AttributeError):
            return None  # not this route's answer: the check goes on without it


def _text(value) -> str:
    """A field that must be a string in an OpenAI answer (anything else: not that API)."""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _is_openai_error(body) -> bool:
    """An OpenAI-style error body (`{"error": {"message": ...}}` or `{"message": ...}`), which an
    OpenAI-compatible server sends; a bare 404 page or `{"detail": "Not Found"}` is not one."""
    return isinstance(body, dict) and bool(body.get("message"))
