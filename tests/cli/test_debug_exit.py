"""issue 25 item 7: ``--debug`` only adds the traceback.

Before: an error exited 2 with one ``Error:`` line, and 1 with an uncaught traceback under
``--debug``. Now the exit code and the last line are the same with and without it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_keeps_the_exit_code_and_the_error_line(tmp_path, where):
    missing = str(tmp_path / "nope")
    plain = _run("ls", missing)
    assert plain.returncode == 2 and plain.stderr.startswith("Error: ") and plain.stderr.count("\n") == 1
    debug = _run("--debug", "ls", missing) if where == "before" else _run("ls", missing, "--debug")
    assert debug.returncode == 2, debug.stderr
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert "CheckpointNotFoundError" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.splitlines()[0]
    assert debug.stdout == plain.stdout == ""
