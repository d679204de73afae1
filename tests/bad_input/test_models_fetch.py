"""`draftsmith models fetch|path` with a name outside the catalog lists the names (issue #18)."""

from __future__ import annotations

import pytest

from draftsmith.offline_models import CATALOG
from tests.helpers.cli import assert_refused, run_cli


@pytest.mark.parametrize("action", ["fetch", "path"])
def test_an_unknown_model_name_lists_the_catalog(tmp_path, monkeypatch, action):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    result = run_cli(["models", action, "smollm3-135m"], subprocess_run=True)
    assert_refused(result, "unknown offline model 'smollm3-135m'",
                   f"choose one of: {', '.join(CATALOG)}")
    assert not (tmp_path / "cache").exists(), "nothing installed for an unknown name"
