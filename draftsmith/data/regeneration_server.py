"""The server a regeneration run talks to: the user's (`base_url: [...]`) or llama.cpp's server
started on the target's own GGUF (`base_url: local`), checked to serve the target before use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from draftsmith.data.config import RegenerateConfig
from draftsmith.data.server_check import check_serves_target
from draftsmith.data.server_client import ChatServer
from draftsmith.errors import DraftsmithError
from draftsmith.files import read_json_dict
from draftsmith.target.offline_models import CATALOG, gguf_path, verify_gguf_file


def target_gguf(spec: str) -> Path:
    """The GGUF file behind a target spec: an offline model's (fetched and verified), a `.gguf`
    path, or the GGUF an offline model's converted folder was made from.

    Raises:
        DraftsmithError: the target has no GGUF, so `base_url: local` cannot serve it.
    """
    path = Path(spec).expanduser()
    name = spec if spec in CATALOG else None
    if name is None and path.is_dir():
        name = (read_json_dict(path / "draftsmith_source.json") or {}).get("name")
    if name in CATALOG:
        path = gguf_path(name)
        if not path.is_file():
            raise DraftsmithError(f"{path} is missing; run `draftsmith models fetch {name}`")
    if path.suffix != ".gguf" or not path.is_file():
        raise DraftsmithError(
            f"data.regenerate.base_url=local serves the target's GGUF with llama.cpp, and the "
            f"target {spec!r} has none: use an offline model name or a .gguf file as the target, "
            f"or start a server yourself (e.g. `vllm serve {spec}`) and set "
            "data.regenerate.base_url to its URL")
    verify_gguf_file(path)
    return path


@contextmanager
def open_regeneration_server(
    settings: RegenerateConfig, target_spec: str, model, tokenizer, template: str,
    max_length: int, log: Callable[[str], None] = print, log_path: Path | None = None,
) -> Iterator[tuple[ChatServer | None, dict]]:
    """`(server, record)` for an `openai` backend, `(None, {})` for `transformers`; a local
    server (its output in `log_path`) is stopped when the block ends (also on errors, Ctrl-C).

    Raises:
        DraftsmithError: no GGUF for a local server, the engine would not start, or the server
            does not serve the target (see `check_serves_target`).
    """
    if settings.backend != "openai":
        yield None, {}
        return
    with ExitStack() as stack:
        record: dict = {}
        if settings.base_url == "local":
            from draftsmith.llama_cpp.server import LlamaCppServer, engine_record

            local = stack.enter_context(LlamaCppServer(
                target_gguf(target_spec), parallel=settings.concurrency,
                ctx_per_slot=max_length + settings.max_new_tokens, alias=Path(target_spec).name,
                log_path=log_path, log=log))
            urls = [local.base_url]
            record.update(engine_record())
        else:
            urls = list(settings.base_url)
        server = ChatServer(urls, settings.model, endpoint=settings.endpoint,
                            concurrency=settings.concurrency, timeout=settings.request_timeout,
                            retries=settings.retries, extra_body=settings.extra_body)
        record.update(check_serves_target(server, model, tokenizer, template, target_spec))
        record.update({"model": server.model, "servers": len(urls), "endpoint": server.endpoint})
        log(f"server {server.shown(0)}{f' (+{len(urls) - 1} more)' if len(urls) > 1 else ''} serves "
            f"{server.model}: tokenizer {record['tokenizer']}, "
            f"template {record.get('template', 'not used (completions)')}, greedy agreement "
            f"with the target {record['greedy_agreement']:.1%}")
        yield server, record
