"""The benchmark's timing of one tool (``benchmarks/_common.run_timed``): the peak it reports is
the tool's own, not the timing process's (a child spawned directly would start at its parent's
high-water mark: ~30 MiB for the benchmark, hundreds after a large allocation)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MIB = 1 << 20


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "benchmarks" / "_common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_the_peak_is_the_tools_own_not_the_timing_process(common):
    held = np.ones(256 * MIB // 8)  # this process's resident memory grows by 256 MiB
    held[::512] = 2.0
    _, small, code = common.run_timed([sys.executable, "-I", "-S", "-c", "pass"])
    _, big, _ = common.run_timed([sys.executable, "-I", "-S", "-c", "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096])"])
    assert code == 0
    assert small < 64 * MIB  # a bare interpreter, not this process's 256+ MiB
    assert big >= 200 * MIB > small
    del held


def test_wall_time_and_exit_codes(common):
    elapsed, _, code = common.run_timed([sys.executable, "-I", "-S", "-c", "import time, sys; time.sleep(0.2); sys.exit(3)"],
                                        ok_codes=(3,))
    assert code == 3 and elapsed >= 0.2  # the tool's own time, its sleep included
    with pytest.raises(common.ToolFailed, match="exit 3"):
        common.run_timed([sys.executable, "-I", "-S", "-c", "import sys; sys.exit(3)"])
    with pytest.raises(common.ToolFailed, match="launcher reported nothing"):
        common.run_timed(["ckptinspect-no-such-tool"])
