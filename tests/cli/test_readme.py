"""The README's Python example runs as written, from the repository root."""

from __future__ import annotations

import os
import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_python_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        namespace: dict = {}
        exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102 - our own README
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "tf-bundle 8 1"
    assert "encoder/enc_dense/kernel (8, 16) float32 (0,)" in out
    assert isinstance(namespace["kernel"], np.ndarray) and namespace["kernel"].shape == (8, 16)
