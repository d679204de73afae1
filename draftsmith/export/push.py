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

# git's rules for a ref name (`git check-ref-format --branch`), which the Hub's git applies
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
_COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")
MAX_REF_PART_BYTES = 255  # a ref part is a file name in the Hub's git repository


def check_repo_id(repo_id: str) -> None:
    """`--repo-id` must be `USER/NAME` or `ORG/NAME` by the Hub's rules (huggingface_hub's own
    `validate_repo_id`: 1-96 characters of letters, digits, `-`, `_`, `.`; no `--` or `..`; no `-`
    or `.` first or last; not ending in `.git`).

    Raises:
        DraftsmithError: naming the value, the rule it breaks and the form to use.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    form = ("USER/NAME or ORG/NAME: each 1-96 letters, digits, '-', '_' or '.', no '--' or '..', "
            "not starting or ending with '-' or '.', e.g. alice/smollm2-eagle3")
    if repo_id.count("/") != 1:
        raise DraftsmithError(f"--repo-id {repo_id!r} must look like {form} (exactly one '/')")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise DraftsmithError(f"the Hub refuses --repo-id {repo_id!r} ({err}); it must look like "
                              f"{form}") from None


def check_revision(revision: str) -> None:
    """`--revision` must be a branch name the Hub's git accepts: git's ref-name rules, and none of
    the Hub's own refs (`refs/pr/N`, `refs/convert/...`) or a name that reads as a commit hash.

    Raises:
        DraftsmithError: naming the value and the rule it breaks.
    """
    parts = revision.split("/")
    problems = [
        (not revision, "it is empty"),
        (bool(_REF_FORBIDDEN.search(revision)),
         "it holds a space, a control character or one of ~ ^ : ? * [ \\"),
        (".." in revision, "it holds '..'"),
        ("@{" in revision or revision == "@", "it holds '@{' or is '@'"),
        (revision.startswith("-"), "it starts with '-'"),
        (revision.endswith("."), "it ends with '.'"),
        (bool(revision) and any(not p for p in parts), "it starts or ends with '/' or holds '//'"),
        (any(p.startswith(".") or p.endswith(".lock") for p in parts),
         "a part between '/' starts with '.' or ends with '.lock'"),
        (any(len(p.encode()) > MAX_REF_PART_BYTES for p in parts),
         f"a part between '/' is longer than {MAX_REF_PART_BYTES} bytes"),
        (revision == "HEAD" or revision.startswith("refs/"),
         "HEAD and refs/... are the Hub's own references"),
        (bool(_COMMIT_HASH.match(revision)), "40 hex digits read as a commit hash"),
    ]
    broken = [why for bad, why in problems if bad]
    if broken:
        raise DraftsmithError(
            f"the Hub refuses --revision {revision!r} as a branch name: {'; '.join(broken)}. Use "
            "letters, digits, '-', '_', '.' and '/', e.g. --revision v1 or --revision exp/lr-3e-4")


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
        DraftsmithError: not an export, pickle files, a repo id or revision the Hub refuses
            (checked in a dry run too), no token, the Hub refusing the
            token (401/403) or any other Hub / network failure (token scrubbed from messages).
    """
    folder = Path(folder)
    if not folder.is_dir() or not is_exported_folder(folder):
        raise DraftsmithError(f"{folder} is not an export folder (no config.json); create one with "
                              "`draftsmith export CKPT --format F --out DIR`")
    check_repo_id(repo_id)
    if revision is not None:
        check_revision(revision)
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
