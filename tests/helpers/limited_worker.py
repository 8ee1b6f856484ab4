"""A worker process that runs ``ckptinspect`` commands under limits (see ``limits.py``).

It imports TensorFlow and runs a few commands on the fixtures first, so TensorFlow's own
address-space reservations (thread pools, allocator arenas) are part of the baseline; then it
caps its address space at the baseline plus ``CKPTINSPECT_TEST_MEMORY`` bytes and answers one
JSON request per line on stdin (``["ls", PATH]``) with one JSON line on stdout: exit code,
stdout, stderr, an unexpected exception (with traceback) if any, the peak resident-memory
growth the command caused (VmHWM after resetting it, minus VmRSS before) and the CPU seconds
it used (all threads).
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from click.testing import CliRunner  # noqa: E402

from ckptinspect.cli import app  # noqa: E402
from ckptinspect._tf import import_tf  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _warm_up(runner: CliRunner) -> None:
    """Run each command once on good inputs: TensorFlow starts its threads and pools now."""
    import h5py  # noqa: F401, PLC0415 - part of the baseline

    import_tf()
    with tempfile.TemporaryDirectory() as tmp:
        for args in (
            ["ls", "--stats", str(FIXTURES / "run")],
            ["diff", str(FIXTURES / "run"), str(FIXTURES / "sharded")],
            ["verify", str(FIXTURES / "keras" / "model.keras")],
            ["ls", "--stats", str(FIXTURES / "keras" / "model.h5")],
            ["extract", str(FIXTURES / "run"), "-o", os.path.join(tmp, "out")],
            ["transplant", str(FIXTURES / "run"), os.path.join(tmp, "t.weights.h5"), "--builder", "no_such_module:build"],
        ):
            runner.invoke(app, args)


def main() -> None:
    limit = int(os.environ.get("CKPTINSPECT_TEST_MEMORY", str(500 << 20)))
    runner = CliRunner()
    _warm_up(runner)
    baseline = _status("VmSize")
    if baseline:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = baseline + limit
        if hard == resource.RLIM_INFINITY or cap <= hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    peak_resets = _reset_peak()
    print(json.dumps({"ready": True, "baseline": baseline, "peak_resets": peak_resets}), flush=True)
    for line in sys.stdin:
        args = json.loads(line)
        _reset_peak()
        before = _status("VmRSS")
        cpu = time.process_time()
        result = runner.invoke(app, args)
        cpu = time.process_time() - cpu  # every thread's CPU time: what the command cost, whatever the load
        growth = max(0, _status("VmHWM") - before) if peak_resets else None
        exception = None
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            exception = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else repr(result.exception)
        print(json.dumps({
            "code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
            "exception": exception, "rss_growth": growth, "cpu_seconds": cpu,
        }), flush=True)


if __name__ == "__main__":
    main()
