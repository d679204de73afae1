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
stops the run with one error (finished shards are kept, so a rerun resumes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

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


class ChatServer:
    """A client for one model served at one or more OpenAI-compatible base URLs.

    Args:
        base_urls: URLs ending in `/v1`; request i goes to `base_urls[i % len(base_urls)]`.
        model: the served model name; None takes the only one the first server lists.
        endpoint: `chat` or `completions` (see the module docstring).
        concurrency: requests in flight at once over all servers.
        timeout: seconds per request.
        retries: retries per request (connection errors, timeouts, 408/409/429/5xx), with
            exponential backoff by the `openai` client.
        extra_body: fields passed through in every request (e.g. `chat_template_kwargs`).
    """

    def __init__(self, base_urls: Sequence[str], model: str | None = None, *,
                 endpoint: str = "chat", concurrency: int = 16, timeout: float = 600.0,
                 retries: int = 3, extra_body: dict | None = None):
        from openai import OpenAI

        key = os.environ.get(API_KEY_ENV) or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.base_urls = list(base_urls)
        self.clients = [OpenAI(base_url=url, api_key=key, timeout=timeout, max_retries=retries)
                        for url in self.base_urls]
        self.endpoint, self.concurrency = endpoint, concurrency
        self.timeout, self.retries = timeout, retries
        self.extra_body = dict(extra_body or {})
        self.model = model or self._only_model()

    def _only_model(self) -> str:
        try:
            served = [m.id for m in self.clients[0].models.list().data]
        except Exception as err:
            raise self._unavailable(0, err) from None
        if len(served) != 1:
            raise DraftsmithError(
                f"the server at {self.base_urls[0]} serves {len(served)} models "
                f"({', '.join(served) or 'none'}); name one with data.regenerate.model")
        return served[0]

    def _unavailable(self, server: int, err: Exception) -> ServerUnavailable:
        import openai

        url = self.base_urls[server]
        if isinstance(err, openai.APITimeoutError):
            why = (f"did not answer within {self.timeout:g} s ({self.retries} retries); raise "
                   "data.regenerate.request_timeout or lower data.regenerate.concurrency")
        elif isinstance(err, openai.APIConnectionError):
            why = ("could not be reached; check data.regenerate.base_url (it ends in /v1, e.g. "
                   "http://127.0.0.1:8000/v1) and that the server is running")
        elif isinstance(err, openai.APIStatusError):
            why = f"answered {err.status_code} after {self.retries} retries: {_message(err)}"
        else:
            why = f"failed: {type(err).__name__}: {err}"
        return ServerUnavailable(f"the server at {url} {why}. Finished shards are kept; run "
                                 "again to resume")

    def complete(self, server: int, messages: list[dict], prompt_ids: list[int], *,
                 max_tokens: int, temperature: float, top_p: float, seed: int | None) -> Reply:
        """One answer to `messages` (chat) or `prompt_ids` (completions), from server
        `server % len(base_urls)`; `seed` is sent when sampling.

        Raises:
            ServerUnavailable: see the class docstring.
        """
        import openai

        server %= len(self.clients)
        client = self.clients[server]
        sampling = dict(model=self.model, max_tokens=max_tokens, temperature=temperature,
                        top_p=top_p, extra_body=self.extra_body or None)
        if seed is not None and temperature > 0:
            sampling["seed"] = seed
        try:
            if self.endpoint == "chat":
                response = client.chat.completions.create(messages=messages, **sampling)
                text = response.choices[0].message.content or ""
            else:
                response = client.completions.create(prompt=prompt_ids, **sampling)
                text = response.choices[0].text or ""
        except openai.APIStatusError as err:
            if err.status_code >= 500 or err.status_code in (408, 429):
                raise self._unavailable(server, err) from None
            return Reply(error=f"{err.status_code}: {_message(err)}")
        except (openai.APIConnectionError, openai.APIError) as err:
            raise self._unavailable(server, err) from None
        choice = response.choices[0]
        tokens = response.usage.completion_tokens if response.usage else 0
        return Reply(text=text, stop="max_new_tokens" if choice.finish_reason == "length" else "eos",
                     tokens=tokens)

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
        tokens = response.json().get("tokens")
        if not isinstance(tokens, list):
            return None
        return [t["id"] if isinstance(t, dict) else int(t) for t in tokens]


def _message(err) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
    return str(err)[:300]
