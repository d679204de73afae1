"""Stopping a training run cleanly on SIGTERM or SIGINT (Ctrl-C): the run finishes the optimizer
step in progress, saves a checkpoint and exits with 128 + the signal's number (143, 130); the same
command resumes it exactly.

Schedulers preempt a job with SIGTERM and a grace period before SIGKILL (SLURM, Kubernetes);
without this, such a stop, `kill` or Ctrl-C lost every step since the last `train.save_every`
checkpoint. A second signal `REPEAT_SECONDS` or more after the first ends the process at once by
the signal's default action (the steps since the last checkpoint are lost). One sooner is the same
request arriving twice: a terminal's Ctrl-C reaches `draftsmith bench` and the training process it
runs, and bench forwards what it receives.

In a run of several processes the signal may reach only some of them: the loop sums the request
over processes with the step's token count (no collective of its own), so every rank stops after
the same step and they save the checkpoint together. It is seen at the end of a step: allow a
preemption's grace period an evaluation (one scheduled when the signal came), a step and a save.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_SECONDS = 2.0


def install_stop_handlers(handler) -> dict:
    """`handler` for SIGTERM and SIGINT; returns the handlers it replaced (none off the main
    thread, where signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}


def restore_handlers(previous: dict) -> None:
    """Put back what `install_stop_handlers` replaced (one set from C, None, as the default)."""
    for signum, handler in previous.items():
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)


class StopRequest:
    """While entered, SIGTERM and SIGINT request a stop instead of ending the process; leaving
    restores the handlers there were. Signals are handled by the main thread only: entered from
    another thread it installs nothing and no stop is ever requested."""

    def __init__(self) -> None:
        self.signum = 0  # the first stop signal received here; 0 while none
        self._received_at = 0.0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        self._previous = install_stop_handlers(self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        restore_handlers(self._previous)
        self._previous = {}

    def counts(self) -> tuple[int, int]:
        """(a stop is requested, it came by SIGTERM) as 0/1, summed over processes each step."""
        return int(self.signum > 0), int(self.signum == signal.SIGTERM)

    def _handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self.signum:
            if now - self._received_at < REPEAT_SECONDS:
                return  # the same request, delivered twice
            # at once, as without this handler: the default action ends the process (a rank
            # blocked in a collective too, where no Python handler would run)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum, self._received_at = signum, now
        name = signal.Signals(signum).name
        # os.write: a handler may run while print() holds the stream's lock
        with contextlib.suppress(OSError):  # a closed stderr must not end this rank alone
            os.write(2, f"\ntrain: {name} received: saving a checkpoint after this step, then "
                        f"stopping ({name} again stops at once and loses the steps since the "
                        "last checkpoint)\n".encode())


def stop_exit_code(requested: float, sigterms: float) -> int | None:
    """The exit code of a run some processes asked to stop, from `StopRequest.counts()` summed over
    processes: 143 when any received SIGTERM, else 130 (SIGINT); None when none asked."""
    if not requested:
        return None
    return 128 + (signal.SIGTERM if sigterms else signal.SIGINT)
