"""`draftsmith push` against a local fake Hub (127.0.0.1, no network): repo creation, one commit
holding every file, branches, dry run, and the auth failures, with the token never shown.

The fake server implements only the routes huggingface_hub's `create_repo`, `create_branch` and
`upload_folder` call (hf_api.py / _commit_api.py): POST /api/repos/create, /api/validate-yaml,
/api/models/{repo}/preupload/{rev} (every file "regular", so contents travel base64 inside the
commit), /api/models/{repo}/branch/{name} and /api/models/{repo}/commit/{rev} (ndjson). Every
request without the right bearer token gets 401, like the Hub.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import huggingface_hub.constants
import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.export import add_push_parser, export_drafter, push_folder
from tests.helpers.export_helpers import make_checkpoint

TOKEN = "hf_fake_secret_token_0123456789"
REPO = re.compile(r"^/api/models/([^/]+/[^/]+)/(preupload|commit|branch)/(.+)$")


class FakeHub:
    """State of the fake Hub: repos, branches, commits, and every request seen."""

    def __init__(self):
        self.repos: dict[str, dict] = {}
        self.commits: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.unknown: list[str] = []


def make_handler(hub: FakeHub, port_box: list[int]):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest output clean
            return

        def reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            hub.requests.append(("GET", self.path))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.reply(401, {"error": "Invalid credentials in Authorization header"})
                return
            hub.unknown.append(f"GET {self.path}")
            self.reply(404, {"error": "not implemented by the fake hub"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(length)
            path = self.path.split("?")[0]
            hub.requests.append(("POST", path))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.reply(401, {"error": "Invalid credentials in Authorization header"})
                return
            url = f"http://127.0.0.1:{port_box[0]}"
            if path == "/api/repos/create":
                payload = json.loads(body)
                repo_id = f"{payload['organization']}/{payload['name']}"
                if repo_id in hub.repos:
                    self.reply(409, {"error": "You already created this model repo",
                                     "url": f"{url}/{repo_id}"})
                    return
                hub.repos[repo_id] = {"visibility": payload.get("visibility"), "branches": {"main"}}
                self.reply(200, {"url": f"{url}/{repo_id}"})
                return
            if path == "/api/validate-yaml":
                self.reply(200, {"errors": [], "warnings": []})
                return
            match = REPO.match(path)
            if not match or match[1] not in hub.repos:
                hub.unknown.append(f"POST {path}")
                self.reply(404, {"error": "Repository not found"})
                return
            repo_id, action, rest = match[1], match[2], match[3]
            if action == "branch":
                hub.repos[repo_id]["branches"].add(rest)
                self.reply(200, {})
            elif action == "preupload":
                files = json.loads(body)["files"]
                self.reply(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                            "shouldIgnore": False, "oid": None} for f in files]})
            elif rest not in hub.repos[repo_id]["branches"]:
                self.reply(404, {"error": f"Revision not found: {rest}"})
            else:
                lines = [json.loads(line) for line in body.decode().splitlines() if line]
                files = {item["value"]["path"]: base64.b64decode(item["value"]["content"])
                         for item in lines if item["key"] == "file"}
                header = next(item["value"] for item in lines if item["key"] == "header")
                hub.commits.append({"repo": repo_id, "revision": rest, "files": files,
                                    "summary": header["summary"]})
                self.reply(200, {"commitUrl": f"{url}/{repo_id}/commit/{'a' * 40}",
                                 "commitOid": "a" * 40, "pullRequestUrl": None})

    return Handler


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """(hub state, endpoint URL) of a threaded local server; the token comes from HF_TOKEN."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    hub, port_box = FakeHub(), [0]
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(hub, port_box))
    port_box[0] = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield hub, f"http://127.0.0.1:{port_box[0]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def export_dir(tmp_path):
    _, _, folder = make_checkpoint(tmp_path, "eagle3")
    return export_drafter(folder, "speculators", tmp_path / "export")


def local_files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in folder.rglob("*") if p.is_file()}


def test_push_creates_the_repo_and_uploads_in_one_commit(fake_hub, export_dir, capsys):
    hub, endpoint = fake_hub
    url = push_folder(export_dir, "alice/tiny-eagle3", private=True, endpoint=endpoint)
    assert url.endswith("/alice/tiny-eagle3/commit/" + "a" * 40)
    assert hub.repos["alice/tiny-eagle3"]["visibility"] == "private"
    assert len(hub.commits) == 1
    commit = hub.commits[0]
    assert commit["revision"] == "main"
    assert commit["files"] == local_files(export_dir)
    assert commit["summary"] == ("Upload eagle3 drafter (speculators layout), exported by "
                                 "draftsmith")
    assert not hub.unknown
    # a second push to the existing repo is another single commit
    push_folder(export_dir, "alice/tiny-eagle3", endpoint=endpoint)
    assert len(hub.commits) == 2
    output = capsys.readouterr()
    assert TOKEN not in output.out + output.err
    assert all(TOKEN.encode() not in data for data in local_files(export_dir).values())


def test_push_to_a_revision_creates_the_branch(fake_hub, export_dir):
    hub, endpoint = fake_hub
    push_folder(export_dir, "alice/tiny-eagle3", revision="v1", endpoint=endpoint)
    assert hub.repos["alice/tiny-eagle3"]["branches"] == {"main", "v1"}
    assert [c["revision"] for c in hub.commits] == ["v1"]


def test_dry_run_lists_files_and_sizes_without_any_request(fake_hub, export_dir, monkeypatch):
    hub, endpoint = fake_hub
    monkeypatch.delenv("HF_TOKEN")
    lines: list[str] = []
    assert push_folder(export_dir, "alice/x", dry_run=True, endpoint=endpoint,
                       log=lines.append) is None
    assert hub.requests == []
    sizes = {p.name: p.stat().st_size for p in export_dir.iterdir() if p.is_file()}
    for name, size in sizes.items():
        assert any(line.endswith(f"  {name}") and f"{size:,}" in line for line in lines), name
    assert f"{sum(sizes.values()):,} bytes" in lines[0]
    assert "no Hugging Face token" in lines[-1]


def test_wrong_token_is_a_clear_error_without_the_token(fake_hub, export_dir, monkeypatch, capsys):
    hub, endpoint = fake_hub
    wrong = "hf_wrong_secret_token_9876543210"
    monkeypatch.setenv("HF_TOKEN", wrong)
    with pytest.raises(DraftsmithError, match=r"refused the token from HF_TOKEN \(HTTP 401\)") as err:
        push_folder(export_dir, "alice/tiny-eagle3", endpoint=endpoint)
    output = capsys.readouterr()
    assert wrong not in str(err.value) and wrong not in output.out + output.err
    # create_repo(exist_ok=True) looks the repo up after a 401, then gives up
    assert hub.requests == [("POST", "/api/repos/create"), ("GET", "/api/models/alice/tiny-eagle3")]
    assert hub.commits == []


def test_no_token_is_a_clear_error(fake_hub, export_dir, monkeypatch):
    hub, endpoint = fake_hub
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(DraftsmithError, match="no Hugging Face token: set HF_TOKEN or run"):
        push_folder(export_dir, "alice/tiny-eagle3", endpoint=endpoint)
    assert hub.requests == []


def test_push_refuses_what_is_not_a_clean_export(fake_hub, export_dir, tmp_path):
    _, endpoint = fake_hub
    with pytest.raises(DraftsmithError, match="must look like USER/NAME"):
        push_folder(export_dir, "no-namespace", endpoint=endpoint)
    _, _, training_output = make_checkpoint(tmp_path, "medusa")
    with pytest.raises(DraftsmithError, match="not an export folder"):
        push_folder(training_output, "alice/x", endpoint=endpoint)
    (export_dir / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(DraftsmithError, match="pickle files"):
        push_folder(export_dir, "alice/x", endpoint=endpoint)


def test_push_cli_dry_run(fake_hub, export_dir, capsys):
    hub, _ = fake_hub
    parser = argparse.ArgumentParser(prog="draftsmith")
    add_push_parser(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(["push", str(export_dir), "--repo-id", "alice/x", "--private",
                              "--revision", "v2", "--dry-run"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "would upload 4 file(s)" in out and "to alice/x (private), branch v2" in out
    assert "model.safetensors" in out and "dry run: nothing uploaded" in out
    assert TOKEN not in out and hub.requests == []


@pytest.mark.parametrize("repo_id, rule", [
    ("alice/" + "n" * 97, "maximum length is 96"),  # too long
    ("alice/tiny--eagle3", "Cannot have -- or .."),
    ("alice/tiny..eagle3", "Cannot have -- or .."),
    ("alice/-tiny", "cannot start or end with '-' or '.'"),
    ("alice/tiny-", "cannot start or end with '-' or '.'"),
    ("alice/.tiny", "cannot start or end with '-' or '.'"),
    ("alice/tiny.", "cannot start or end with '-' or '.'"),
    ("alice/tiny eagle3", "alphanumeric chars"),
    ("alice/tiny@eagle3", "alphanumeric chars"),
    ("alice/tiny.git", "cannot end by '.git'"),
    ("alice/tiny/eagle3", "(exactly one '/')"),
    ("no-namespace", "(exactly one '/')"),
])
def test_dry_run_refuses_a_repo_id_the_hub_refuses(fake_hub, export_dir, repo_id, rule):
    hub, endpoint = fake_hub
    with pytest.raises(DraftsmithError, match=r"must look like USER/NAME or ORG/NAME") as err:
        push_folder(export_dir, repo_id, dry_run=True, endpoint=endpoint, log=lambda _: None)
    assert repr(repo_id) in str(err.value) and rule in str(err.value)
    assert hub.requests == []


@pytest.mark.parametrize("revision, rule", [
    ("v1..2", "it holds '..'"),
    ("my branch", "a space"),
    ("v1:rc", "one of ~ ^ : ? * ["),
    ("v1~1", "one of ~ ^ : ? * ["),
    ("-v1", "it starts with '-'"),
    ("v1.", "it ends with '.'"),
    ("/v1", "starts or ends with '/'"),
    ("exp//v1", "holds '//'"),
    ("exp/.hidden", "starts with '.' or ends with '.lock'"),
    ("v1.lock", "starts with '.' or ends with '.lock'"),
    ("v@{1}", "'@{'"),
    ("x" * 256, "longer than 255 bytes"),
    ("refs/pr/1", "the Hub's own references"),
    ("HEAD", "the Hub's own references"),
    ("0123456789abcdef0123456789abcdef01234567", "read as a commit hash"),
    ("", "it is empty"),
])
def test_dry_run_refuses_a_revision_the_hub_refuses(fake_hub, export_dir, revision, rule):
    hub, endpoint = fake_hub
    with pytest.raises(DraftsmithError, match=r"the Hub refuses --revision .* as a branch name") as err:
        push_folder(export_dir, "alice/x", revision=revision, dry_run=True, endpoint=endpoint,
                    log=lambda _: None)
    assert rule in str(err.value) and "e.g. --revision v1" in str(err.value)
    assert hub.requests == []


def test_dry_run_accepts_names_the_hub_accepts(fake_hub, export_dir):
    hub, endpoint = fake_hub
    for repo_id, revision in (("alice/x", None), ("Org_1/tiny.eagle3-v2_b", "exp/lr-3e-4"),
                              ("a/" + "n" * 96, "release.v1_2")):
        assert push_folder(export_dir, repo_id, revision=revision, dry_run=True,
                           endpoint=endpoint, log=lambda _: None) is None
    assert hub.requests == []
