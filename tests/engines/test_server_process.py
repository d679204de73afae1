"""Stopping a server stops its whole process group: a worker that outlives the main process (as an
engine's workers can) is killed too, so nothing keeps a core busy for the tests that follow."""

from __future__ import annotations

import subprocess
import sys
import time

from draftsmith.engines.server_process import ServerProcess, _group_alive

# a main process whose worker ignores SIGTERM and would run on after the main one exits
STUBBORN = ("import os, signal, subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
            "time.sleep(300)\n")


def test_stop_leaves_no_process_of_the_group(tmp_path):
    server = ServerProcess()
    server.process = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True)
    time.sleep(1.0)  # the worker is started
    assert _group_alive(server.process.pid)
    start = time.monotonic()
    server.stop(grace_seconds=2.0)
    assert not _group_alive(server.process.pid)
    assert time.monotonic() - start < 10


def test_stop_returns_at_once_when_the_group_exits_on_sigterm():
    server = ServerProcess()
    server.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                      start_new_session=True)
    start = time.monotonic()
    server.stop(grace_seconds=20.0)
    assert server.process.returncode is not None
    assert time.monotonic() - start < 5


def test_a_second_stop_signals_nothing(monkeypatch):
    """After a stop, the old group id may name another group: a second stop leaves it alone."""
    import draftsmith.engines.server_process as server_process

    server = ServerProcess()
    server.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                      start_new_session=True)
    server.stop()
    signalled = []
    monkeypatch.setattr(server_process.os, "killpg", lambda *args: signalled.append(args))
    server.stop()
    assert signalled == []
