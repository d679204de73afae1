"""`draftsmith models fetch|path` with a name outside the catalog lists the names; `fetch` of a
fetched model reads its GGUF again (size, then sha256) and refuses a corrupted one with the
command that redoes it (issue #18)."""

from __future__ import annotations

import os

import pytest

from draftsmith.target import offline_models
from draftsmith.target.offline_models import CATALOG
from tests.helpers.cli import assert_refused, run_cli


@pytest.mark.parametrize("action", ["fetch", "path"])
def test_an_unknown_model_name_lists_the_catalog(tmp_path, monkeypatch, action):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    result = run_cli(["models", action, "smollm3-135m"], subprocess_run=True)
    assert_refused(result, "unknown offline model 'smollm3-135m'",
                   f"choose one of: {', '.join(CATALOG)}")
    assert not (tmp_path / "cache").exists(), "nothing installed for an unknown name"


@pytest.fixture
def fetched(tmp_path, monkeypatch):
    from tests.serving.fake_targets import fetched_offline_model

    return fetched_offline_model(tmp_path, monkeypatch)


def test_fetch_of_a_fetched_model_verifies_its_gguf_and_folder(fetched):
    result = run_cli(["models", "fetch", fetched.name])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(offline_models.model_dir(fetched.name))
    assert f"verifying {offline_models.gguf_path(fetched.name)} (size and sha256)" in result.stderr


def test_fetch_notices_a_cached_gguf_corrupted_in_place(fetched):
    gguf = offline_models.gguf_path(fetched.name)
    offline_models.verify_gguf_file(gguf)  # a load that recorded its hash under (size, mtime)
    stat = gguf.stat()
    data = bytearray(gguf.read_bytes())
    data[-100] ^= 0xFF  # bit rot: same size, mtime put back, so only a fresh hash can tell
    gguf.write_bytes(bytes(data))
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    result = run_cli(["models", "fetch", fetched.name])
    assert_refused(result, f"{gguf} is corrupted", f"does not match the expected {fetched.sha256}",
                   f"run `draftsmith models fetch {fetched.name} --force`")


def test_fetch_notices_a_cached_gguf_of_the_wrong_size(fetched):
    gguf = offline_models.gguf_path(fetched.name)
    gguf.write_bytes(gguf.read_bytes()[:-10])
    result = run_cli(["models", "fetch", fetched.name])
    assert_refused(result, f"{gguf} has {fetched.size - 10:,} bytes but tiny-offline should have "
                   f"{fetched.size:,}", f"run `draftsmith models fetch {fetched.name} --force`")
