"""Shared test fixtures.

Checkpoints are written by real TensorFlow / Keras, once per session, into a temporary
directory. ``REALWORLD`` points at ``../shared/realworld`` (the corpus of checkpoints from
other people's projects); tests that use it skip cleanly where it is absent.
"""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Tables fit COLUMNS when it is set; the tests compare full tables (those that fit set it).
os.environ.pop("COLUMNS", None)

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The shared test helpers (builders, crafted files, the hardening catalogue) import as top-level
# modules, from every test folder and from the worker scripts run in subprocesses.
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
FIXTURES = ROOT / "fixtures"
REALWORLD = pathlib.Path(
    os.environ.get("CKPTINSPECT_REALWORLD", ROOT.parent / "shared" / "realworld")
)


@pytest.fixture(scope="session")
def realworld() -> pathlib.Path:
    """The real-world corpus folder; skips the test when it is absent."""
    if not (REALWORLD / "MANIFEST.md").is_file():
        pytest.skip(f"real-world corpus not found at {REALWORLD}")
    return REALWORLD


@pytest.fixture(scope="session")
def limited():
    """A worker that runs CLI commands with a 10 s and 500 MiB limit each (see ``limits.py``)."""
    from limits import LimitedRunner  # noqa: PLC0415

    runner = LimitedRunner()
    yield runner
    runner.close()
