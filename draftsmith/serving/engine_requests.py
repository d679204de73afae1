"""Requests to llama.cpp's own server endpoints: greedy completions of token ids and its counters.

`/completion` takes the prompt as token ids (so the engine and draftsmith's loop decode exactly the
same context) and answers with the new token ids and `timings` (`predicted_n`, `predicted_ms`,
and with a draft `draft_n` / `draft_n_accepted`). `/metrics` (Prometheus text, when the server
was started with metrics) adds the spec-decode counters per draft position.
"""

from __future__ import annotations

import re
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

    @property
    def target_steps(self) -> int:
        """Verification steps: every step emits its accepted drafts plus one token."""
        return max(len(self.tokens) - self.draft_accepted, 1)


def complete_greedy(root_url: str, prompt_ids: list[int], max_new_tokens: int,
                    timeout: float = 600.0) -> EngineAnswer:
    """Greedy decoding of `prompt_ids` (no prompt cache, so every request prefills the same way).

    Raises:
        DraftsmithError: the server refused the request or answered without tokens.
    """
    body = {"prompt": prompt_ids, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
            "return_tokens": True, "cache_prompt": False}
    try:
        response = httpx.post(f"{root_url}/completion", json=body, timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError as err:
        raise DraftsmithError(f"llama.cpp's server at {root_url} failed a completion: {err}") from err
    answer = response.json()
    if "tokens" not in answer or "timings" not in answer:
        raise DraftsmithError(f"llama.cpp's server answered without tokens or timings: "
                              f"{sorted(answer)}")
    timings = answer["timings"]
    return EngineAnswer(tokens=list(answer["tokens"]), predicted_ms=float(timings["predicted_ms"]),
                        draft_n=int(timings.get("draft_n", 0)),
                        draft_accepted=int(timings.get("draft_n_accepted", 0)))


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


def accepted_per_position(metrics: dict[str, float], draft_max: int) -> list[float]:
    """Accepted draft tokens at each draft position over all drafts (llama.cpp's counters)."""
    name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
    return [metrics.get(f'{name}{{position="{k}"}}', 0.0) for k in range(draft_max)]
