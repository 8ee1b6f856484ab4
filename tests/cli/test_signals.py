"""Issue 27 item 13: SIGTERM, SIGHUP (and SIGINT) while ``extract``, ``rewrite`` and ``average``
write leave nothing behind, and the process exits with 128 + the signal's number.

Real processes on real inputs: a 64 MiB safetensors file and the TF bundle ``extract`` writes
from it; the signal is sent as soon as the command's temporary output appears."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

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
    return {"safetensors": st, "tf": tf_prefix}


def command(name: str, inputs: dict[str, pathlib.Path], out: pathlib.Path) -> list[str]:
    if name == "extract":
        return ["extract", str(inputs["safetensors"]), "-o", str(out / "model.safetensors")]
    if name == "rewrite":
        return ["rewrite", str(inputs["safetensors"]), "-o", str(out / "model.safetensors"), "--rename", "^w$=v"]
    return ["average", str(inputs["tf"]), str(inputs["tf"]), "-o", str(out / "avg")]


def interrupted(args: list[str], out: pathlib.Path, sig: int) -> subprocess.CompletedProcess | None:
    """Run ``ckptinspect ARGS``; send ``sig`` once a temporary output exists in ``out``; None when
    the command finished first."""
    proc = subprocess.Popen([sys.executable, "-m", "ckptinspect", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=out, preexec_fn=default_sigint)
    deadline = time.monotonic() + 120
    sent = False
    while time.monotonic() < deadline and proc.poll() is None:
        if out.is_dir() and any(n.startswith(TMP_MARK) for n in os.listdir(out)):
            proc.send_signal(sig)
            sent = True
            break
        time.sleep(0.002)
    stdout, stderr = proc.communicate(timeout=120)
    if not sent:
        return None
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


CASES = [(cmd, sig) for cmd in ("extract", "rewrite", "average") for sig in ("SIGTERM", "SIGHUP", "SIGINT")]
DEFAULT = {("extract", "SIGTERM"), ("average", "SIGHUP")}


@pytest.mark.parametrize("name,sig", [
    pytest.param(c, s, marks=() if (c, s) in DEFAULT else pytest.mark.slow) for c, s in CASES
])
def test_a_signal_mid_write_leaves_nothing_behind(name, sig, inputs, tmp_path):
    signum = getattr(signal, sig)
    out = tmp_path / "out"
    out.mkdir()
    before = {p: p.stat().st_size for p in inputs["safetensors"].parent.rglob("*") if p.is_file()}
    for _ in range(3):  # a command that finished before the signal is run again
        result = interrupted(command(name, inputs, out), out, signum)
        if result is not None:
            break
        for p in out.iterdir():
            p.unlink()
    else:
        pytest.skip(f"{name} finished three times before it could be signalled")
    assert result.returncode == 128 + signum, (result.returncode, result.stderr[-500:])
    assert "Traceback" not in result.stderr
    assert os.listdir(out) == [], os.listdir(out)  # no temporary, no partial output
    assert {p: p.stat().st_size for p in inputs["safetensors"].parent.rglob("*") if p.is_file()} == before
