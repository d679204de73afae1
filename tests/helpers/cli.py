"""Running the `draftsmith` command line in tests: in this process (fast, for refusals that never
load a model) or as `python -m draftsmith` (what a user runs), with what a bad-input test checks."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import traceback
from dataclasses import dataclass

from draftsmith.cli import main


@dataclass
class CliResult:
    """Exit code and output of one command."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        """The lines that report an error: draftsmith's own and argparse's (`PROG: error: ...`)."""
        return [line for line in self.stderr.splitlines() if ": error: " in line]


def run_cli(args: list[str], *, subprocess_run: bool = False, timeout: float = 120) -> CliResult:
    """Run `draftsmith ARGS`; in this process unless `subprocess_run`.

    In this process an exception that escapes `main` is written to stderr as the interpreter
    would write it ("Traceback ..."), with exit code 1, so both ways are checked the same way.
    """
    if subprocess_run:
        done = subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True,
                              text=True, timeout=timeout)
        return CliResult(done.returncode, done.stdout, done.stderr)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse refusals
            code = exit_.code if isinstance(exit_.code, int) else 1
        except Exception:  # reported as the interpreter would, then asserted on
            traceback.print_exc()
            code = 1
    return CliResult(code, out.getvalue(), err.getvalue())


def assert_refused(result: CliResult, *phrases: str, code: int = 2) -> str:
    """The command failed with `code`, no traceback, one error line holding every phrase.

    Returns:
        That error line.
    """
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.error_lines
    assert len(lines) == 1, result.stderr
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])
    return lines[0]
