"""Run ``ckptinspect`` commands with a time and memory limit, so a hang or an unbounded read
fails its test instead of stalling or swapping the whole suite.

:class:`LimitedRunner` keeps one worker process (``limited_worker.py``: TensorFlow imported and
warmed up once, then its address space capped at that baseline plus :data:`LIMIT_BYTES`) and
sends it one command at a time. A command that uses more than :data:`LIMIT_SECONDS` of CPU
time comes back as timed out: CPU time, not wall time, so a machine busy with other work does
not fail a command that does little (no test may depend on the machine's speed). A command that
does not answer within :data:`HANG_SECONDS` of wall time (blocked on a FIFO, say) gets its
worker killed (the next command starts a fresh one) and comes back as timed out too; a worker
that dies (a C++ abort inside TensorFlow) comes back as crashed. The resident-memory growth of
each command is measured too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import queue
import subprocess
import sys
import threading

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).with_name("limited_worker.py")
LIMIT_SECONDS = 10.0  # CPU seconds per command
HANG_SECONDS = 90.0  # wall seconds per command: a command waiting on something that never comes
LIMIT_BYTES = 500 << 20  # address space above the warmed-up baseline, and peak RSS growth
START_SECONDS = 120.0  # TensorFlow's import and the warm-up, on a busy 2-core machine
_TIMEOUT = "<timeout>"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one limited command did.

    Attributes:
        exit_code: The exit code (None when it timed out or crashed).
        stdout: What it wrote to stdout.
        stderr: What it wrote to stderr.
        exception: The traceback of an unexpected exception, or None.
        rss_growth: Peak resident-memory growth in bytes, or None where it cannot be measured.
        timed_out: It did not finish within the time limit.
        crashed: The worker process died (its return code is in ``stderr``).
    """

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    exception: str | None = None
    rss_growth: int | None = None
    timed_out: bool = False
    crashed: bool = False

    def describe(self) -> str:
        """One line for assertion messages."""
        if self.timed_out:
            return f"timed out (over {LIMIT_SECONDS:.0f} CPU seconds, or no answer in {HANG_SECONDS:.0f} s)"
        if self.crashed:
            return f"worker crashed: {self.stderr[-500:]}"
        return f"exit {self.exit_code}; stdout {self.stdout[-800:]!r}; stderr {self.stderr[-800:]!r}; {self.exception or ''}"


class LimitedRunner:
    """A worker process that runs CLI commands one at a time under the limits."""

    def __init__(self, memory: int = LIMIT_BYTES, seconds: float = LIMIT_SECONDS):
        self.memory = memory
        self.seconds = seconds
        self._proc: subprocess.Popen | None = None
        self._lines: queue.Queue | None = None
        self.baseline: int | None = None
        self.peak_resets = False

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(WORKER.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["CKPTINSPECT_TEST_MEMORY"] = str(self.memory)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["MALLOC_ARENA_MAX"] = "2"  # one 64 MiB arena per thread would eat the address-space budget
        env.pop("CKPTINSPECT_TF_LOGS", None)
        self._proc = subprocess.Popen(
            [sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env, cwd=str(ROOT),
        )
        self._lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self._proc, self._lines), daemon=True).start()
        hello = self._next(START_SECONDS)
        if hello in (None, _TIMEOUT) or not json.loads(hello).get("ready"):
            self.close()
            raise RuntimeError("the limited worker did not start")
        info = json.loads(hello)
        self.baseline, self.peak_resets = info["baseline"], info["peak_resets"]

    @staticmethod
    def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def _next(self, timeout: float) -> str | None:
        """The worker's next line; None at end of output; :data:`_TIMEOUT` when none came."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return _TIMEOUT

    def run(self, args: list[str]) -> Outcome:
        """Run ``ckptinspect ARGS`` in the worker, within the limits."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        proc = self._proc
        proc.stdin.write(json.dumps([str(a) for a in args]) + "\n")
        proc.stdin.flush()
        line = self._next(max(HANG_SECONDS, self.seconds))
        if line is _TIMEOUT:
            self.close()
            return Outcome(None, timed_out=True)
        if line is None:  # the worker died: a C++ abort, or the kernel's OOM killer
            self.close()
            return Outcome(None, stderr=f"worker exited with {proc.returncode}", crashed=True)
        out = json.loads(line)
        if out["cpu_seconds"] > self.seconds:
            return Outcome(None, out["stdout"], out["stderr"], timed_out=True)
        return Outcome(out["code"], out["stdout"], out["stderr"], out["exception"], out["rss_growth"])

    def close(self) -> None:
        """Stop the worker (a killed one is reaped)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def children_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process's waited-for children: a time
    bound on a subprocess's work that a busy machine does not stretch, as wall time is."""
    import resource  # noqa: PLC0415

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def default_sigint() -> None:
    """``preexec_fn`` for a child that must meet SIGINT and SIGHUP as a terminal's process does:
    a process started with them ignored (a pytest-xdist worker, a background job, ``nohup`` for
    SIGHUP) passes the ignoring on to its children; Python then installs no KeyboardInterrupt
    handler, and ckptinspect leaves an ignored SIGHUP ignored (as ``nohup`` asked)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
