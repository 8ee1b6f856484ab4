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


class ObjectStore:
    """A real S3-compatible server (moto's, a subprocess on 127.0.0.1), ``proxy`` in front of it
    (delays, counts, cuts; see ``object_store.py``), and the committed fixtures uploaded under
    ``s3://fixtures/`` (``url(rel)`` names one). ``env`` points the standard variables at the
    proxy, for subprocesses; the ``s3`` fixture sets them in this process."""

    def __init__(self, endpoint, proxy):
        self.endpoint = endpoint
        self.proxy = proxy
        from object_store import DUMMY_ENV  # noqa: PLC0415

        self.env = {**os.environ, **DUMMY_ENV, "AWS_ENDPOINT_URL": proxy.endpoint}

    def url(self, rel: str) -> str:
        return f"s3://fixtures/{rel}"


@pytest.fixture(scope="session")
def object_store():
    """One moto server for the session (skipped when moto's server or s3fs is not installed)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    pytest.importorskip("flask")
    from object_store import Proxy, moto_server, upload_tree  # noqa: PLC0415

    with moto_server() as endpoint:
        proxy = Proxy(endpoint)
        upload_tree(endpoint, FIXTURES, "fixtures")
        try:
            yield ObjectStore(endpoint, proxy)
        finally:
            proxy.close()


@pytest.fixture
def s3(object_store, monkeypatch):
    """The object store, with this process's environment pointed at it (through the proxy, no
    delay) and ckptinspect's remembered names forgotten."""
    from object_store import DUMMY_ENV  # noqa: PLC0415

    from ckptinspect.formats import remote as _remote  # noqa: PLC0415

    for k, v in DUMMY_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", object_store.proxy.endpoint)
    object_store.proxy.delay = 0.0
    object_store.proxy.cut(0)
    _remote.clear()
    yield object_store
    object_store.proxy.cut(0)
    _remote.clear()
