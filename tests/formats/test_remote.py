"""Remote paths through fsspec: `ls` reads the index and ranged bytes, never whole data files.

The remote file system is a real fsspec ``AbstractFileSystem`` (the local one under a test
protocol) whose open files count the bytes they return; the checkpoints are written by
TensorFlow. Nothing of ckptinspect is replaced.
"""

from __future__ import annotations

import collections
import json
import pathlib

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.formats.remote import WINDOW_BYTES
from ckptinspect.formats.tf.index import OBJECT_GRAPH_KEY, read_index

fsspec = pytest.importorskip("fsspec")
from fsspec.implementations.local import LocalFileSystem  # noqa: E402

tf = pytest.importorskip("tensorflow")

PROTOCOL = "ckptcount"
RUN = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "run"
READ: collections.Counter[str] = collections.Counter()
runner = CliRunner()


class CountingFS(LocalFileSystem):
    """The local file system under ``ckptcount://``, counting the bytes each file returns."""

    protocol = PROTOCOL

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3:]
        return super()._strip_protocol(path)

    def _open(self, path, mode="rb", **kwargs):
        f = super()._open(path, mode, **kwargs)
        name = self._strip_protocol(path)
        plain = f.read

        def read(*args):
            data = plain(*args)
            READ[name] += len(data)
            return data

        f.read = read
        return f


@pytest.fixture(autouse=True)
def counting():
    fsspec.register_implementation(PROTOCOL, CountingFS, clobber=True)
    READ.clear()
    yield READ


def remote(prefix: str | pathlib.Path) -> str:
    return f"{PROTOCOL}://{pathlib.Path(prefix).resolve()}"


def data_read(prefix: str | pathlib.Path) -> int:
    return sum(n for p, n in READ.items() if ".data-" in p and p.startswith(str(pathlib.Path(prefix).resolve())))


@pytest.fixture(scope="module")
def name_based(tmp_path_factory):
    """A name-based bundle (no object graph), written by TensorFlow's SaveV2, 4 MiB of data."""
    prefix = str(tmp_path_factory.mktemp("remote") / "ckpt")
    values = {"dense/kernel": np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024), "dense/bias": np.ones(7, np.float32)}
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(values), shape_and_slices=[""] * len(values),
                      tensors=[tf.constant(v) for v in values.values()])
    return prefix, values


def test_ls_reads_the_index_and_only_the_object_graph_bytes():
    prefix = RUN / "ckpt-8"
    graph = next(e for e in read_index(str(prefix)).entries if e.key == OBJECT_GRAPH_KEY)
    result = runner.invoke(app, ["ls", remote(prefix), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    local = json.loads(runner.invoke(app, ["ls", str(prefix), "--format", "json"]).stdout)
    assert [v["name"] for v in json.loads(result.stdout)["variables"]] == [v["name"] for v in local["variables"]]
    assert READ[str(prefix) + ".index"] == (prefix.parent / "ckpt-8.index").stat().st_size
    # A ranged read of the graph entry and a few scalars (the step), in metadata windows: no
    # more than one window past the graph (the file is smaller than a window here).
    assert graph.size <= data_read(prefix) <= graph.size + WINDOW_BYTES
    assert graph.size < (prefix.parent / "ckpt-8.data-00000-of-00001").stat().st_size


def test_ls_of_a_name_based_checkpoint_reads_no_data_bytes(name_based):
    prefix, values = name_based
    with ckptinspect.open(remote(prefix)) as ck:
        assert sorted(v.key for v in ck) == sorted(values)
    assert data_read(prefix) == 0
    assert READ[prefix + ".index"] == pathlib.Path(prefix + ".index").stat().st_size


def test_ls_stats_reads_each_tensor_once(name_based):
    prefix, values = name_based
    result = runner.invoke(app, ["ls", remote(prefix), "--stats", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    rows = {v["key"]: v for v in json.loads(result.stdout)["variables"]}
    kernel = values["dense/kernel"].astype(np.float64)
    assert rows["dense/kernel"]["stats"]["max"] == kernel.max()
    assert rows["dense/kernel"]["stats"]["mean"] == pytest.approx(kernel.mean(), rel=1e-12)
    data = next(pathlib.Path(prefix).parent.glob("ckpt.data-*")).stat().st_size
    # every tensor's bytes once, in ranged reads (a small tensor's window may overlap the next)
    assert data <= data_read(prefix) <= data + WINDOW_BYTES


def test_diff_and_verify_through_the_remote_file_system():
    a, b = RUN / "ckpt-4", RUN / "ckpt-8"
    far = ckptinspect.diff(remote(a), remote(b)).to_dict()
    near = ckptinspect.diff(a, b).to_dict()
    assert [(v["name"], v["status"], v["max_abs_diff"]) for v in far["variables"]] == [
        (v["name"], v["status"], v["max_abs_diff"]) for v in near["variables"]]
    assert ckptinspect.verify(remote(b)).intact
