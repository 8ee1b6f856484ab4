"""Issue 27 item 13: SIGTERM, SIGHUP (and SIGINT) while ``extract``, ``rewrite`` and ``average``
write leave nothing behind, and the process exits with 128 + the signal's number.

Real processes on real inputs: a 64 MiB safetensors file and the TF bundle ``extract`` writes
from it, read over HTTP from a real server on 127.0.0.1 that holds the reads of tensor data
until the test has sent the signal (tests/helpers/range_server.py): the command is caught
mid-write, its temporary output on disk, whatever the machine's speed."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import range_server
from limits import default_sigint

ROOT = pathlib.Path(__file__).resolve().parents[2]
TMP_MARK = ".ckptinspect-tmp-"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, pathlib.Path]:
    d = tmp_path_factory.mktemp("signal-inputs")
    a = np.ones((16, 1 << 20), np.float32)  # 64 MiB: long enough to be caught mid-write
    header = json.dumps({"w": {"dtype": "F32", "shape": list(a.shape), "data_offsets": [0, a.nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    st = d / "big.safetensors"
    st.write_bytes(struct.pack("<Q", len(header)) + header + a.tobytes())
    tf_prefix = d / "tf" / "ckpt"
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "extract", str(st), "-o", str(tf_prefix)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shutil.copytree(tf_prefix.parent, d / "tf2")  # average takes each checkpoint once
    return {"safetensors": st, "tf": tf_prefix, "half": 8 + len(header) + a.nbytes // 2}


@pytest.fixture(scope="module")
def server(inputs):
    srv = range_server.serve(str(inputs["safetensors"].parent), range_server.HoldingHandler)
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    range_server.HoldingHandler.released.set()
    srv.shutdown()


def command(name: str, url: str, out: pathlib.Path) -> list[str]:
    if name == "extract":
        return ["extract", f"{url}/big.safetensors", "-o", str(out / "model.safetensors")]
    if name == "rewrite":
        return ["rewrite", f"{url}/big.safetensors", "-o", str(out / "model.safetensors"), "--rename", "^w$=v"]
    return ["average", f"{url}/tf/ckpt", f"{url}/tf2/ckpt", "-o", str(out / "avg")]


def interrupted(args: list[str], out: pathlib.Path, sig: int) -> subprocess.CompletedProcess:
    """Run ``ckptinspect ARGS`` while the server holds its reads of tensor data; send ``sig``
    once a read is held and a temporary output exists in ``out``; then let the reads go on."""
    held = range_server.HoldingHandler.held
    proc = subprocess.Popen([sys.executable, "-m", "ckptinspect", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=out, preexec_fn=default_sigint)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if held.is_set() and any(n.startswith(TMP_MARK) for n in os.listdir(out)):
                proc.send_signal(sig)
                break
            time.sleep(0.01)
        else:
            proc.kill()
            pytest.fail(f"no held read with a temporary output in {out}: {os.listdir(out)}, exit {proc.returncode}")
    finally:
        range_server.HoldingHandler.released.set()
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


CASES = [(cmd, sig) for cmd in ("extract", "rewrite", "average") for sig in ("SIGTERM", "SIGHUP", "SIGINT")]
DEFAULT = {("extract", "SIGTERM"), ("average", "SIGHUP")}


@pytest.mark.parametrize("name,sig", [
    pytest.param(c, s, marks=() if (c, s) in DEFAULT else pytest.mark.slow) for c, s in CASES
])
def test_a_signal_mid_write_leaves_nothing_behind(name, sig, inputs, server, tmp_path):
    signum = getattr(signal, sig)
    out = tmp_path / "out"
    out.mkdir()
    before = {p: p.stat().st_size for p in inputs["safetensors"].parent.rglob("*") if p.is_file()}
    # Reads of the second half of the tensor data wait: the first half is written by then.
    if name == "average":
        range_server.HoldingHandler.hold(".data-00000-of-00001", (inputs["half"] - 8) // 2)
    else:
        range_server.HoldingHandler.hold("big.safetensors", inputs["half"])
    result = interrupted(command(name, server, out), out, signum)
    assert result.returncode == 128 + signum, (result.returncode, result.stderr[-500:])
    assert "Traceback" not in result.stderr
    assert os.listdir(out) == [], os.listdir(out)  # no temporary, no partial output
    assert {p: p.stat().st_size for p in inputs["safetensors"].parent.rglob("*") if p.is_file()} == before


def test_a_killed_extract_leaves_no_output_under_its_name(inputs, server, tmp_path):
    """SIGKILL runs no cleanup: the temporary output stays (``--force`` clears ours later), but
    nothing is ever under the output's own name."""
    out = tmp_path / "out"
    out.mkdir()
    range_server.HoldingHandler.hold("big.safetensors", inputs["half"])
    result = interrupted(command("extract", server, out), out, signal.SIGKILL)
    assert result.returncode == -signal.SIGKILL
    names = os.listdir(out)
    assert [n for n in names if n.startswith(TMP_MARK)], names  # caught mid-write
    assert [n for n in names if not n.startswith(TMP_MARK)] == [], names
