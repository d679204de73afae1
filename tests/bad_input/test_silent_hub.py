"""A Hub endpoint that accepts connections and never answers (a dead mirror in `HF_ENDPOINT`): a
target or a data source given as a Hub id fails within seconds, once, naming the endpoint and the
offline alternative, where huggingface_hub would wait without end or retry for half a minute."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from draftsmith.data.sources import load_conversations
from draftsmith.errors import DraftsmithError
from draftsmith.target.load import load_target, load_tokenizer
from draftsmith.target.source import HUB_PROBE_TIMEOUT_S

BOUND_S = HUB_PROBE_TIMEOUT_S + 5  # the probe's wait, plus slack for a busy machine


@pytest.fixture
def silent_hub(monkeypatch, tmp_path):
    """HF_ENDPOINT pointing at a loopback socket that accepts and never answers; yields
    (endpoint URL, accepted connections)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept():
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:  # closed at teardown
                return

    threading.Thread(target=accept, daemon=True).start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_ETAG_TIMEOUT", raising=False)
    yield endpoint, accepted
    listener.close()
    for connection in accepted:
        connection.close()


def test_hub_id_target_fails_in_seconds_naming_the_endpoint(silent_hub):
    endpoint, accepted = silent_hub
    for load in (lambda: load_target("some-org/never-answered-model", dtype="float32"),
                 lambda: load_tokenizer("some-org/never-answered-tokenizer")):
        start = time.perf_counter()
        with pytest.raises(DraftsmithError) as err:
            load()
        assert time.perf_counter() - start < BOUND_S
        message = str(err.value)
        assert f"the Hugging Face Hub at {endpoint} is unreachable (no answer within 5 s" in message
        assert "HF_HUB_ETAG_TIMEOUT" in message and "draftsmith models fetch" in message
        assert "local folder or .gguf file" in message
    assert len(accepted) == 2  # one probe per id: no retries


def test_hub_dataset_fails_in_seconds_without_retries(silent_hub, capfd):
    endpoint, accepted = silent_hub
    start = time.perf_counter()
    with pytest.raises(DraftsmithError) as err:
        load_conversations("some-org/never-answered-dataset", split="train")
    assert time.perf_counter() - start < BOUND_S
    message = str(err.value)
    assert f"the Hugging Face Hub at {endpoint} is unreachable (no answer within 5 s" in message
    assert "`sharegpt` for the offline ShareGPT set" in message and "HF_HUB_OFFLINE=1" in message
    assert len(accepted) == 1
    assert "Retrying" not in capfd.readouterr().err


def test_invalid_hub_dataset_id_is_named_without_asking_the_hub(silent_hub):
    _, accepted = silent_hub
    with pytest.raises(DraftsmithError, match=r"'some org/bad\.\.name' is not a file or folder "
                                              r"here nor a valid Hub dataset id"):
        load_conversations("some org/bad..name")
    assert not accepted
