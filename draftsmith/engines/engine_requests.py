"""Requests to serving engines: an engine's answer, the OpenAI greedy completion of token ids and
the engines' own counters (llama.cpp's native `/completion` is `draftsmith.llama_cpp.server`'s).

vLLM's OpenAI `/v1/completions` takes token ids and returns the new ids with `return_token_ids`;
it reports no per-request timings, so its answers are timed by the client. Both engines serve
Prometheus `/metrics` with spec-decode counters (`llamacpp:` / `vllm:` prefixes), per draft
position included.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import httpx

from draftsmith.errors import DraftsmithError

METRIC_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


@dataclass
class EngineAnswer:
    """One greedy answer and the engine's own accounting of it."""

    tokens: list[int]
    predicted_ms: float
    draft_n: int = 0
    draft_accepted: int = 0
    drafts: int | None = None  # drafts made for this answer (the engine's counter's change)
    accepted_per_position: list[int] | None = None  # its accepted drafts at each position

    @property
    def target_steps(self) -> int:
        """Verification steps: every step emits its accepted drafts plus one token."""
        return max(len(self.tokens) - self.draft_accepted, 1)


def read_metrics(root_url: str) -> dict[str, float]:
    """`/metrics` as {name or name{labels}: value}; {} when the endpoint is off."""
    try:
        response = httpx.get(f"{root_url}/metrics", timeout=30.0)
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    values = {}
    for line in response.text.splitlines():
        match = METRIC_LINE.match(line.strip())
        if match and not line.startswith("#"):
            key = match["name"] + (f"{{{match['labels']}}}" if match["labels"] else "")
            values[key] = float(match["value"])
    return values


def metric_total(metrics: dict[str, float], name: str, position: int | None = None) -> float:
    """A counter summed over its label sets (vLLM labels every series with engine and model),
    optionally only the series of one draft `position`."""
    total = 0.0
    for key, value in metrics.items():
        base, _, labels = key.partition("{")
        if base == name and (position is None or f'position="{position}"' in labels):
            total += value
    return total


def accepted_per_position(metrics: dict[str, float], draft_max: int,
                          prefix: str = "llamacpp") -> list[float]:
    """Accepted draft tokens at each draft position over all drafts (the engine's counters)."""
    name = f"{prefix}:spec_decode_num_accepted_tokens_per_pos_total"
    return [metric_total(metrics, name, k) for k in range(draft_max)]


def count_answer(answer: EngineAnswer, before: dict[str, float], after: dict[str, float],
                 draft_max: int, prefix: str) -> None:
    """Set the answer's drafts and accepted tokens per draft position from the engine's
    counters read before and after its request (one request at a time)."""
    drafts = f"{prefix}:spec_decode_num_drafts_total"
    answer.drafts = round(metric_total(after, drafts) - metric_total(before, drafts))
    answer.accepted_per_position = [
        round(a - b) for a, b in zip(accepted_per_position(after, draft_max, prefix),
                                     accepted_per_position(before, draft_max, prefix),
                                     strict=True)]


def complete_greedy_openai(base_url: str, model: str, prompt_ids: list[int], max_new_tokens: int,
                           timeout: float = 900.0) -> EngineAnswer:
    """Greedy decoding of `prompt_ids` through an OpenAI `/v1/completions` that returns token
    ids (vLLM's `return_token_ids`); `predicted_ms` is the request's wall time (prefill included,
    the same for plain and speculative runs of one prompt).

    Raises:
        DraftsmithError: the server refused the request or answered without token ids.
    """
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_new_tokens,
            "temperature": 0.0, "return_token_ids": True}
    start = time.perf_counter()
    try:
        response = httpx.post(f"{base_url}/completions", json=body, timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError as err:
        raise DraftsmithError(f"the server at {base_url} failed a completion: {err}") from err
    seconds = time.perf_counter() - start
    choices = response.json().get("choices") or [{}]
    tokens = choices[0].get("token_ids")
    if tokens is None:
        raise DraftsmithError(f"the server at {base_url} answered without token ids "
                              f"({sorted(choices[0])}); it needs `return_token_ids` (vLLM >= 0.10)")
    return EngineAnswer(tokens=list(tokens), predicted_ms=seconds * 1000)
