"""Issue 27 item 15: a checkpoint at a path the system cannot look up (longer than PATH_MAX, or a
name longer than NAME_MAX) is said to have a name too long, not to be missing."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.errors import CheckpointNotFoundError

ROOT = pathlib.Path(__file__).resolve().parents[2]
WEIGHTS = ROOT / "fixtures" / "keras" / "model.weights.h5"


@pytest.fixture
def deep_checkpoint(tmp_path, monkeypatch) -> str:
    """A real .weights.h5 at an absolute path of more than 4,096 bytes (made through relative
    steps, as a training job nesting its output folders would)."""
    monkeypatch.chdir(tmp_path)
    while len(os.getcwd()) < 4200:
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
    shutil.copy(WEIGHTS, "model.weights.h5")
    full = os.getcwd() + "/model.weights.h5"
    os.chdir(tmp_path)
    return full


def test_a_path_longer_than_path_max(deep_checkpoint):
    with pytest.raises(CheckpointNotFoundError, match=r"name too long: it is \d+ bytes, longer than the system's \d+"):
        ckptinspect.open(deep_checkpoint)
    for command in ("ls", "verify"):
        result = CliRunner().invoke(app, [command, deep_checkpoint])
        assert result.exit_code == 2, result.output
        assert "name too long" in result.stderr and "no such file" not in result.stderr


def test_a_name_longer_than_name_max(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match=r"name too long: a name in it is 303 bytes"):
        ckptinspect.open(str(tmp_path / ("x" * 300 + ".h5")))


def test_a_missing_short_path_is_still_missing(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no such file"):
        ckptinspect.open(str(tmp_path / "absent.h5"))
