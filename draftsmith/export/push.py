"""`draftsmith push`: upload an export folder to the Hugging Face Hub in one commit.

The token comes from `HF_TOKEN` or the saved `hf auth login`, through huggingface_hub; it is never
printed, logged or written, and it is scrubbed from any error message. The endpoint is
huggingface_hub's (`HF_ENDPOINT`), or the `endpoint` argument (tests use a local server).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from draftsmith.drafter_folder import DRAFTER_CONFIG
from draftsmith.errors import DraftsmithError
from draftsmith.export.load import is_exported_folder
from draftsmith.export.weights import PICKLE_SUFFIXES, read_json

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def upload_files(folder: Path) -> list[tuple[str, int]]:
    """(path in repo, size in bytes) of everything that would be uploaded: the folder's files,
    without hidden files and unfinished `*.partial` entries."""
    files = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and not any(p.startswith(".") or p.endswith(".partial")
                                      for p in relative.parts):
            files.append((relative.as_posix(), path.stat().st_size))
    return files


def _network_errors() -> tuple[type[Exception], ...]:
    """Transport errors of the HTTP client huggingface_hub uses (httpx2, or httpx before it)."""
    errors: list[type[Exception]] = [OSError]
    for name in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "***") if token else text


def push_folder(folder: str | Path, repo_id: str, private: bool = False,
                revision: str | None = None, dry_run: bool = False, endpoint: str | None = None,
                log: Callable[[str], None] = print) -> str | None:
    """Create `repo_id` if needed and upload `folder` to it in a single commit.

    Args:
        folder: an export folder (`draftsmith export ... --out folder`).
        repo_id: `USER/NAME` or `ORG/NAME`.
        private: create the repo private (an existing repo keeps its visibility).
        revision: branch to commit to (created from main when missing); None = main.
        dry_run: only list the files and sizes; no token or network needed.
        endpoint: Hub URL; None = huggingface_hub's default (`HF_ENDPOINT`).
        log: where progress lines go.

    Returns:
        The commit URL, or None for a dry run.

    Raises:
        DraftsmithError: not an export, pickle files, bad repo id, no token, the Hub refusing the
            token (401/403) or any other Hub / network failure (token scrubbed from messages).
    """
    folder = Path(folder)
    if not folder.is_dir() or not is_exported_folder(folder):
        raise DraftsmithError(f"{folder} is not an export folder (no config.json); create one with "
                              "`draftsmith export CKPT --format F --out DIR`")
    if not REPO_ID.match(repo_id):
        raise DraftsmithError(f"--repo-id {repo_id!r} must look like USER/NAME")
    files = upload_files(folder)
    pickles = [name for name, _ in files if name.endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise DraftsmithError(f"{folder} contains pickle files {pickles[:3]}; draftsmith pushes "
                              "safetensors only: remove them")
    branch = revision or "main"
    visibility = "private" if private else "public unless it exists"
    log(f"{'would upload' if dry_run else 'uploading'} {len(files)} file(s), "
        f"{sum(s for _, s in files):,} bytes, to {repo_id} ({visibility}), branch {branch}:")
    for name, size in files:
        log(f"  {size:>14,}  {name}")
    token = _token()
    if dry_run:
        log("dry run: nothing uploaded" + ("" if token else "; no Hugging Face token is set, so a "
                                           "real push would fail (set HF_TOKEN or run `hf auth "
                                           "login`)"))
        return None
    if not token:
        raise DraftsmithError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (the "
                              "token needs write access to the repo's namespace)")
    return _upload(folder, repo_id, private, revision, endpoint, token, log)


def _token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def _commit_message(folder: Path) -> str:
    meta = read_json(folder / DRAFTER_CONFIG) if (folder / DRAFTER_CONFIG).is_file() else {}
    fmt = (meta.get("export") or {}).get("format", "unknown format")
    return f"Upload {meta.get('kind', 'drafter')} drafter ({fmt} layout), exported by draftsmith"


def _upload(folder: Path, repo_id: str, private: bool, revision: str | None,
            endpoint: str | None, token: str, log: Callable[[str], None]) -> str:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi(endpoint=endpoint, token=token)
    source = "HF_TOKEN" if os.environ.get("HF_TOKEN") else "the saved Hugging Face login"
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        info = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision,
                                 repo_type="model", commit_message=_commit_message(folder),
                                 ignore_patterns=[".*", "**/.*", "*.partial", "*.partial/**"])
    except HfHubHTTPError as err:
        status = getattr(err.response, "status_code", None)
        if status in (401, 403):
            raise DraftsmithError(
                f"the Hub refused the token from {source} (HTTP {status}) for {repo_id}: check "
                "that it is valid and has write access to that namespace (`hf auth login`)"
            ) from None
        raise DraftsmithError(f"pushing {folder} to {repo_id} failed: "
                              f"{_scrub(str(err), token)}") from None
    except OfflineModeIsEnabled:
        raise DraftsmithError("HF_HUB_OFFLINE is set: unset it to push to the Hub") from None
    except _network_errors() as err:
        raise DraftsmithError(f"cannot reach the Hub at {api.endpoint}: "
                              f"{_scrub(str(err), token)}") from None
    log(f"pushed {repo_id} @ {revision or 'main'}: {info.commit_url}")
    return info.commit_url
