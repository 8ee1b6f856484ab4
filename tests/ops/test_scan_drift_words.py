"""Issue 25 item 18: a jump in a layer whose median change is zero is said plainly (the drift
line read "infx its median 0")."""

from __future__ import annotations

import numpy as np
import pytest

import ckptinspect

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def test_a_jump_after_no_change_is_said_plainly(tmp_path):
    rng = np.random.default_rng(0)
    still = rng.standard_normal(64).astype(np.float32)
    paths = []
    for step in range(1, 7):
        moving = rng.standard_normal(64).astype(np.float32)
        value = still if step < 6 else still + 1.0  # unchanged for 4 transitions, then a jump
        path = tmp_path / f"ckpt_{step}.safetensors"
        safetensors_numpy.save_file({"still/kernel": value, "moving/kernel": moving}, str(path))
        paths.append(str(path))
    report = ckptinspect.scan(paths)
    jumps = [d for d in report.drift if d.kind == "jumped" and d.layer == "still"]
    assert len(jumps) == 1, report.drift
    assert jumps[0].path.endswith("ckpt_6.safetensors") and "at number 6 in its name" in jumps[0].detail
    assert jumps[0].detail.endswith("while it otherwise did not change (median change 0)"), jumps[0].detail
    assert "inf" not in jumps[0].detail
