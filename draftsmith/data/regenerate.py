"""Regenerate every assistant turn with the target, so drafters learn the target's own outputs.

Each conversation keeps its system prompt and user turns; assistant turn k is replaced by the
target's answer to the conversation so far (its own earlier answers included). Two backends give
the answers (`data.regenerate.backend`):

  * `transformers`: the target in this process, batched left-padded `generate` (prompts grouped by
    length under a row and token budget), greedy or sampled, capped at `max_new_tokens`.
  * `openai`: an OpenAI-compatible server (see `server_client.py`), e.g. vLLM or SGLang on GPUs,
    or llama.cpp's server that draftsmith starts itself on the target's GGUF (`base_url: local`).

Each shard is answered turn by turn (`regeneration_turns.py`). A conversation stops early when its
prompt no longer fits `max_length` or an answer comes back empty (skipped, counted by reason); one
whose request the server refused is failed (listed with its error). Every conversation of the
input is regenerated, failed or skipped.

Output: `shard-00000.jsonl` ... holding `{"id", "index", "messages", "stops"}` records (`stops`
says per answer whether it ended at EOS or at the cap; an answer cut at the cap is also marked
`"cut": true`, so rendering trains no end-of-turn token after it) and `manifest.json` listing
finished shards with the conversation indices they cover and their failures. Shards are fixed by
the input order and `shard_size`, written atomically and sampled with a per-shard seed, so a run
resumed after a kill writes exactly the shards an uninterrupted run writes.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.data.batching import plan_batches
from draftsmith.data.config import RegenerateConfig
from draftsmith.data.conversations import Conversation
from draftsmith.data.identity import TargetIdentity, text_sha256
from draftsmith.data.regeneration_turns import regenerate_shard
from draftsmith.data.server_client import Reply
from draftsmith.data.shards import ShardReport, open_run, record_shard
from draftsmith.errors import DraftsmithError
from draftsmith.files import write_atomic


@dataclass
class RegenerationReport(ShardReport):
    """What a `regenerate` call did (this call only; `tokens`: tokens generated)."""

    conversations_written: int = 0
    dropped: Counter = field(default_factory=Counter)
    failed: list = field(default_factory=list)  # {"index", "id", "error"} per failed conversation

    @property
    def new_tokens(self) -> int:
        return self.tokens

    def add_shard(self, shard: AnsweredShard) -> None:
        """Count a shard this call wrote."""
        self.wrote(shard.seconds, shard.new_tokens)
        self.conversations_written += len(shard.records)
        self.dropped.update(shard.dropped)
        self.failed += shard.failed


@dataclass
class AnsweredShard:
    """One shard regenerated (`regenerate_shard`), as `regenerate` saves and counts it.

    Attributes:
        index, first, count: the shard's index, its first conversation's index, its size.
        records, new_tokens, dropped, failed: what `regenerate_shard` returns.
        seconds: how long the answers took.
    """

    index: int
    first: int
    count: int
    records: list[dict]
    new_tokens: int
    dropped: Counter
    failed: list[dict]
    seconds: float

    @property
    def file(self) -> str:
        return f"shard-{self.index:05d}.jsonl"

    def manifest_entry(self) -> dict:
        """How the run's manifest records the shard."""
        return {
            "index": self.index, "file": self.file, "first": self.first, "count": self.count,
            "written": len(self.records), "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 3),
            "stops": dict(Counter(s for r in self.records for s in r["stops"])),
            "dropped": dict(self.dropped), "failed": self.failed,
        }


@torch.inference_mode()
def generate_batch(
    model, prompts: Sequence[list[int]], settings: RegenerateConfig, eos_ids: Sequence[int],
    pad_id: int,
) -> list[tuple[list[int], bool]]:
    """Answer a batch of token prompts with one left-padded `generate` call: per prompt, the
    answer's token ids (EOS excluded) and whether it ended at EOS.

    Sampling parameters are passed explicitly (top-k off, no repetition penalty) so the model's
    own generation defaults do not leak in.
    """
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt):] = 1
    sampling = settings.temperature > 0
    extra = dict(temperature=settings.temperature, top_p=settings.top_p, top_k=0) if sampling else {}
    output = model.generate(
        input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
        max_new_tokens=settings.max_new_tokens, do_sample=sampling, repetition_penalty=1.0,
        eos_token_id=list(eos_ids), pad_token_id=pad_id, **extra,
    )
    answers = []
    stop = set(eos_ids)
    for row in output[:, width:].tolist():
        end = next((k for k, t in enumerate(row) if t in stop), None)
        answers.append((row if end is None else row[:end], end is not None))
    return answers


class InProcessResponder:
    """The `transformers` backend: answers a round of requests with batched `generate`."""

    def __init__(self, model, tokenizer, settings: RegenerateConfig, eos_ids: Sequence[int]):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.eos_ids = list(eos_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]

    def __call__(self, requests: Sequence[tuple[int, list[dict], list[int]]]) -> list[Reply]:
        replies: list[Reply | None] = [None] * len(requests)
        settings = self.settings
        for rows in plan_batches([len(ids) for _, _, ids in requests], settings.batch_size,
                                 settings.batch_tokens, settings.max_new_tokens):
            answers = generate_batch(self.model, [requests[r][2] for r in rows], settings,
                                     self.eos_ids, self.pad_id)
            for row, (tokens, hit_eos) in zip(rows, answers, strict=True):
                replies[row] = Reply(
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    stop="eos" if hit_eos else "max_new_tokens", tokens=len(tokens) + hit_eos)
        return replies


class ServerResponder:
    """The `openai` backend: answers a round of requests through a `ChatServer`, seeded per
    request so a resumed run asks exactly what an uninterrupted one asks."""

    def __init__(self, server, settings: RegenerateConfig):
        self.server, self.settings = server, settings

    def __call__(self, requests: Sequence[tuple[int, list[dict], list[int]]]) -> list[Reply]:
        s = self.settings
        return self.server.complete_all(requests, max_tokens=s.max_new_tokens,
                                        temperature=s.temperature, top_p=s.top_p,
                                        seed=s.seed * 1_000_003)


def conversations_sha256(conversations: Sequence[Conversation]) -> str:
    """Fingerprint of the input conversations (ids and messages, in order)."""
    digest = hashlib.sha256()
    for conversation in conversations:
        digest.update(json.dumps(conversation.to_json(), sort_keys=True).encode("utf-8"))
    return digest.hexdigest()


def regenerate(
    model, tokenizer, conversations: Sequence[Conversation], out_dir: str | Path, *,
    template: str, settings: RegenerateConfig, max_length: int, eos_ids: Sequence[int],
    identity: TargetIdentity | None = None, stop_after_shards: int | None = None,
    progress: bool = True, server=None,
) -> RegenerationReport:
    """Regenerate `conversations` into sharded JSONL under `out_dir`, resuming a previous run.

    Args:
        model, tokenizer: the frozen target.
        conversations: the cleaned input, in a fixed order (shard k holds indices
            `[k * shard_size, (k + 1) * shard_size)`).
        out_dir: the run folder (`manifest.json` + shards).
        template: the chat template (see `render.resolve_chat_template`).
        settings: generation and sharding settings.
        max_length: a conversation stops before a prompt of this many tokens.
        eos_ids: tokens that end an answer (e.g. `Target.eos_token_ids`).
        identity: the target's identity, stored and checked on resume (default: computed).
        stop_after_shards: write at most this many new shards, then return (time-boxed runs,
            tests of resume).
        progress: show a tqdm bar.
        server: the `ChatServer` that answers when `settings.backend` is `openai` (checked by
            `server_check.check_serves_target` first), or a zero-argument callable returning
            it, called only when a shard still needs answering (a finished run starts no
            server).

    Raises:
        DraftsmithError: no EOS id, or `out_dir` holds a run with other inputs or settings.
        ServerUnavailable: the server went away; finished shards are kept (a rerun resumes).
    """
    if not eos_ids:
        raise DraftsmithError("the target has no EOS token id, so answers would never end; set "
                              "eos_token_id in its generation_config.json")
    out_dir = Path(out_dir)
    identity = identity or TargetIdentity.of(model, tokenizer)
    size = settings.shard_size
    num_shards = -(-len(conversations) // size)
    manifest = open_run(out_dir, "regenerated", _run_settings(
        identity, template, settings, max_length, eos_ids, conversations))
    if settings.backend == "openai" and server is None:
        raise ValueError("data.regenerate.backend is openai but no server was given")
    respond = _first_use_responder(model, tokenizer, settings, eos_ids, server)
    report = RegenerationReport.start(out_dir, manifest, num_shards)
    budget = f" (budget {settings.max_minutes:g} min)" if settings.max_minutes else ""
    bar = tqdm(total=len(conversations), desc=f"regenerate{budget}", unit="conv",
               disable=not progress, smoothing=0.1)
    bar.update(sum(s["count"] for s in manifest["shards"]))
    sizes = [len(conversations[i * size: (i + 1) * size]) for i in range(num_shards)]
    for index in report.pending(manifest, sizes, "count", settings.max_minutes,
                                stop_after_shards):
        shard = _answer_shard(respond, tokenizer, conversations, index, settings,
                              template=template, max_length=max_length, progress=bar)
        _save_shard(out_dir, manifest, shard)
        report.add_shard(shard)
        bar.update(shard.count)
    bar.close()
    return report


def _run_settings(identity: TargetIdentity, template: str, settings: RegenerateConfig,
                  max_length: int, eos_ids: Sequence[int],
                  conversations: Sequence[Conversation]) -> dict:
    """Everything that decides a regeneration run's shards (a resumed run must match it)."""
    return {
        "target": identity.to_json(), "chat_template_sha256": text_sha256(template),
        "generation": {k: getattr(settings, k) for k in
                       ("backend", "max_new_tokens", "temperature", "top_p", "seed")},
        "shard_size": settings.shard_size, "max_length": max_length, "eos_ids": sorted(eos_ids),
        "conversations": len(conversations),
        "conversations_sha256": conversations_sha256(conversations),
    }


def _first_use_responder(model, tokenizer, settings: RegenerateConfig, eos_ids: Sequence[int],
                         server) -> Callable[[Sequence], list[Reply]]:
    """The backend `settings.backend` names, built when it is first asked (a finished run
    builds none and starts no server; `server` may be a callable that returns one)."""
    responder = None

    def respond(requests):
        nonlocal responder
        if responder is None:
            if settings.backend == "openai":
                responder = ServerResponder(server() if callable(server) else server, settings)
            else:
                responder = InProcessResponder(model, tokenizer, settings, eos_ids)
        return responder(requests)
    return respond


def _answer_shard(respond, tokenizer, conversations: Sequence[Conversation], index: int,
                  settings: RegenerateConfig, *, template: str, max_length: int,
                  progress: tqdm) -> AnsweredShard:
    """Regenerate shard `index`, sampled with its own seed (a resumed run draws what an
    uninterrupted one draws), and time it."""
    first = index * settings.shard_size
    chunk = conversations[first: first + settings.shard_size]
    torch.manual_seed(settings.seed * 1_000_003 + index)
    start = time.perf_counter()
    records, new_tokens, dropped, failed = regenerate_shard(
        respond, tokenizer, chunk, first, template=template, max_length=max_length,
        progress=progress)
    return AnsweredShard(index, first, len(chunk), records, new_tokens, dropped, failed,
                         time.perf_counter() - start)


def _save_shard(out_dir: Path, manifest: dict, shard: AnsweredShard) -> None:
    """Write the shard's records atomically, then record it in the run's manifest."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in shard.records)
    write_atomic(out_dir / shard.file, lambda tmp: tmp.write_text(lines, encoding="utf-8"))
    record_shard(out_dir, manifest, shard.manifest_entry())
