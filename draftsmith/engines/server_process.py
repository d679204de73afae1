"""A serving engine's process on loopback: started by a subclass, waited for until `/health`
answers, its log's tail quoted when it fails, stopped with its whole process group when the
`with` block ends (also on Ctrl-C and on errors)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from draftsmith.errors import DraftsmithError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """Base of `LlamaCppServer` and `VllmServer`: `name`, `log_path`, `startup_timeout`, `port`
    and `process` are set by the subclass, which also says what it is `loading()`."""

    name = "the server"
    poll_seconds = 0.25
    log_path: Path
    startup_timeout: float
    process: subprocess.Popen | None = None
    port = 0
    _group_stopped = False

    @property
    def root_url(self) -> str:
        """Where the engine's own endpoints are (`/health`, `/metrics`, ...)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API."""
        return f"{self.root_url}/v1"

    def loading(self) -> str:
        raise NotImplementedError

    def launch(self, command: list[str], env: dict | None = None) -> None:
        """Start `command` with its output in `log_path`, then wait until it is healthy."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)
        self._group_stopped = False
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        url = f"{self.root_url}/health"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DraftsmithError(f"{self.name} exited with code {self.process.returncode} "
                                      f"while loading {self.loading()}:\n{self.log_tail()}")
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(self.poll_seconds)
        raise DraftsmithError(f"{self.name} did not answer {url} within "
                              f"{self.startup_timeout:g} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 12) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_seconds: float = 20.0) -> None:
        """SIGTERM to the engine's process group, SIGKILL after `grace_seconds`; returns once no
        process of the group is left (an engine's workers can outlive its main process, and a
        left-over busy worker starves everything that runs after it on a small machine)."""
        if self.process is None or self._group_stopped:
            return  # a second call must not signal a group id the system may have reused
        group = self.process.pid
        if _signal_group(group, signal.SIGTERM) and not _group_gone(group, grace_seconds):
            _signal_group(group, signal.SIGKILL)
            _group_gone(group, 10.0)
        self.process.wait()
        self._group_stopped = True

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(group: int, sig: int) -> bool:
    """Send `sig` to every process of `group`; False when the group has no process left."""
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):  # gone, or the id now names another's group
        return False
    return True


def _group_gone(group: int, seconds: float) -> bool:
    """Wait up to `seconds` for every process of `group` to end; whether they all did."""
    deadline = time.monotonic() + seconds
    while _group_alive(group):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _group_alive(group: int) -> bool:
    """Whether a process of `group` still runs (zombies, which hold no CPU, do not count: this
    machine's init may never reap an engine's orphaned workers)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return _signal_group(group, 0)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False
