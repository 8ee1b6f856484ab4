"""``http://`` / ``https://`` paths (issue 29): checkpoints served by a real HTTP server on
127.0.0.1 that answers ranged GETs (tests/helpers/range_server.py) read as the local files do,
listing fetches only their metadata (the Hugging Face Hub serves safetensors this way)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

import range_server
from ckptinspect.cli import app
from ckptinspect.formats import remote

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")  # fsspec's HTTP file system

runner = CliRunner()
# a TF prefix (its .index and data file found by name), a Keras 3 file (HDF5 read in place),
# a torch zip, a safetensors file
CHECKPOINTS = ["run/ckpt-8", "keras/model.weights.h5", "torch/training.pt", "torch/model.safetensors"]


@pytest.fixture(scope="module")
def http_root():
    server = range_server.serve(str(FIXTURES))
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def _local(doc: dict, root: str) -> str:
    return json.dumps(doc, sort_keys=True).replace(root, "ROOT/")


@pytest.mark.parametrize("rel", CHECKPOINTS)
def test_ls_stats_and_verify_over_http_are_what_they_are_locally(http_root, rel):
    for command in (["ls"], ["ls", "--stats"], ["verify"]):
        far = _local(_json(*command, http_root + rel), http_root)
        near = _local(_json(*command, str(FIXTURES / rel)), str(FIXTURES) + "/")
        assert far == near, command


@pytest.mark.parametrize("rel", ["run/ckpt-8", "torch/model.safetensors"])
def test_diff_over_http_against_the_local_file_is_equal(http_root, rel):
    doc = _json("diff", http_root + rel, str(FIXTURES / rel))
    assert doc["variables"] and all(v["status"] == "equal" for v in doc["variables"]), doc["variables"][:3]


def test_listing_a_safetensors_file_takes_at_most_three_requests(http_root):
    """Nothing remembered from earlier tests: one ranged GET gives the object's size and its
    first window (no HEAD), one asks for a TF index named like it (404), one reads the footer a
    TF table would have. (A HEAD and fsspec's GET after a 404 HEAD made it 5.)"""
    remote.clear()
    before = range_server.RangeHandler.requests
    _json("ls", http_root + "torch/model.safetensors")
    assert range_server.RangeHandler.requests - before <= 3


def test_listing_a_tf_prefix_reads_its_index_in_one_request(tmp_path):
    """A name-based bundle of 3,000 variables (its .index 90 KiB) over HTTP, where nothing can be
    listed: one ranged GET gives the index's size and all of it. (The prefix itself asked first,
    and the index in two windows, made it 3.)"""
    np = pytest.importorskip("numpy")
    st = pytest.importorskip("safetensors.numpy")
    st.save_file({f"layer_{i:04d}/kernel": np.full((16,), i, np.float32) for i in range(3000)}, str(tmp_path / "m.safetensors"))
    result = runner.invoke(app, ["extract", str(tmp_path / "m.safetensors"), "-o", str(tmp_path / "tf" / "ckpt"), "--to", "tf"])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "tf" / "ckpt.index").stat().st_size > 64 << 10
    server = range_server.serve(str(tmp_path))
    try:
        root = f"http://127.0.0.1:{server.server_address[1]}/"
        remote.clear()
        before = range_server.RangeHandler.requests
        far = _local(_json("ls", root + "tf/ckpt"), root)
        asked = range_server.RangeHandler.requests - before
    finally:
        server.shutdown()
        server.server_close()
    assert far == _local(_json("ls", str(tmp_path / "tf" / "ckpt")), str(tmp_path) + "/")
    assert asked <= 2, asked  # was 3; a bundle with an object graph adds the data file's size and the graph's window


def test_a_missing_object_costs_one_request_per_name_asked(http_root):
    remote.clear()
    before = range_server.RangeHandler.requests
    result = runner.invoke(app, ["ls", http_root + "torch/no_such.safetensors"])
    assert result.exit_code == 2
    assert range_server.RangeHandler.requests - before == 2  # the name and the name + ".index"


def test_a_missing_object_is_one_error_line(http_root):
    result = runner.invoke(app, ["ls", http_root + "torch/no_such.safetensors"])
    assert result.exit_code == 2 and result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
