"""Every format on a real S3-compatible server (moto's, on 127.0.0.1; see ``object_store.py``):
``ls``, ``ls --stats``, ``verify``, ``diff`` (remote against local) and ``scan`` of a remote
series give what they give for the same files on the local disk; request counts through a
delaying proxy; remote errors in one line, without the credentials."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from object_store import run_counted

from ckptinspect.cli import app

runner = CliRunner()

# Every committed fixture format: TF bundles (a prefix, a directory, a sharded directory with
# sliced variables), Keras .h5 / .weights.h5 / .keras, torch zip and legacy, safetensors, HF
# folders (safetensors and .bin shards), npz, a Keras 3 series directory.
CHECKPOINTS = [
    "run/ckpt-8",
    "run",
    "sharded",
    "keras/model.h5",
    "keras/model.weights.h5",
    "keras/model.keras",
    "keras/keras2_weights.h5",
    "torch/state_dict.pt",
    "torch/training_legacy.pt",
    "torch/model.safetensors",
    "torch/hf_sharded",
    "torch/hf_bin_sharded",
    "torch/expected.npz",
    "series/keras3_weights",
]
# The default run keeps one of each family (and stays fast); the slow run has them all.
FAST = {"run/ckpt-8", "keras/model.keras", "torch/state_dict.pt", "torch/hf_sharded"}


def some(items, fast=FAST):
    return [item if (item[0] if isinstance(item, tuple) else item) in fast else pytest.param(
        *(item if isinstance(item, tuple) else (item,)), marks=pytest.mark.slow) for item in items]


def same(text: str, *roots: str) -> str:
    for root in roots:
        text = text.replace(root, "ROOT")
    return text


def cli(*args: str):
    return runner.invoke(app, list(args))


def both(s3, args_of) -> tuple[str, str]:
    """The output of a command on the remote copy and on the local files, paths made equal."""
    far = cli(*args_of(s3.url("")))
    near = cli(*args_of(str(FIXTURES) + "/"))
    assert far.exit_code == near.exit_code, (far.stdout, far.stderr, near.stderr)
    return same(far.stdout, "s3://fixtures/"), same(near.stdout, str(FIXTURES) + "/")


@pytest.mark.parametrize("rel", some(CHECKPOINTS))
def test_ls_is_the_same_remote_and_local(s3, rel):
    far, near = both(s3, lambda root: ["ls", root + rel, "--format", "json"])
    assert json.loads(far)["variables"], far
    assert far == near


@pytest.mark.parametrize("rel", some(CHECKPOINTS, {"torch/model.safetensors"}))
def test_stats_and_verify_are_the_same_remote_and_local(s3, rel):
    far, near = both(s3, lambda root: ["ls", root + rel, "--stats", "--format", "json"])
    assert far == near
    far, near = both(s3, lambda root: ["verify", root + rel, "--format", "json"])
    assert far == near


@pytest.mark.parametrize("rel", some(["run/ckpt-8", "sharded", "keras/model.keras", "keras/model.h5", "torch/state_dict.pt",
                                      "torch/training_legacy.pt", "torch/model.safetensors", "torch/hf_sharded",
                                      "torch/expected.npz"], {"run/ckpt-8"}))
def test_diff_remote_against_local_is_a_self_diff(s3, rel):
    local = str(FIXTURES / rel)
    far = cli("diff", s3.url(rel), local, "--format", "json")
    near = cli("diff", local, local, "--format", "json")
    assert far.exit_code == near.exit_code == 0, far.stderr
    assert same(far.stdout, s3.url(rel), local) == same(near.stdout, local)


@pytest.mark.slow
def test_diff_of_two_remote_checkpoints_finds_the_changes(s3):
    far = cli("diff", s3.url("run/ckpt-4"), s3.url("run/ckpt-8"), "--format", "json")
    near = cli("diff", str(FIXTURES / "run/ckpt-4"), str(FIXTURES / "run/ckpt-8"), "--format", "json")
    assert far.exit_code == near.exit_code == 1  # they differ
    assert same(far.stdout, "s3://fixtures/") == same(near.stdout, str(FIXTURES) + "/")


@pytest.mark.slow
@pytest.mark.parametrize("rel", ["run", "series/keras3_weights", "series/lightning"])
def test_scan_of_a_remote_series(s3, rel):
    far, near = both(s3, lambda root: ["scan", root + rel, "--format", "json"])
    report = json.loads(far)
    assert report["series"] != "paths" and len(report["steps"]) >= 2, far
    assert far == near


# -- requests, through the delaying proxy, in a fresh process ----------------------------------
@pytest.mark.parametrize(("rel", "most"), some([
    ("torch/model.safetensors", 3),  # the header: one LIST (name, size), one GET of the first window
    ("run/ckpt-8", 3),  # one LIST (index, shards), the index, the object graph's window
    ("keras/model.keras", 3),  # the zip's tail (central directory), the weights' HDF5 metadata window
    ("torch/state_dict.pt", 3),
    ("torch/hf_sharded", 6),  # the name and the folder listed, the index JSON, each of 3 shards' header
    ("run", 9),  # the name, the folder listed once, the state file, each of 3 checkpoints' index and step
    ("series/keras3_weights", 5),  # the name, the folder listed once, each of 3 files' first window
], {"torch/model.safetensors", "run/ckpt-8"}))
def test_ls_request_count(s3, rel, most):
    proc, requests = run_counted(s3, "ls", s3.url(rel), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["variables"]
    assert 1 <= requests <= most, requests


@pytest.mark.slow
def test_values_stream_in_few_requests_not_one_per_block(s3, tmp_path):
    """``ls --stats`` of a 36 MiB safetensors file: the values in the streamer's chunks
    (``remote.CHUNK_BYTES``, 2 MiB), not one request per 1 MiB block read."""
    np = pytest.importorskip("numpy")
    st = pytest.importorskip("safetensors.numpy")
    from object_store import upload_tree  # noqa: PLC0415

    path = tmp_path / "big.safetensors"
    st.save_file({"a": np.arange(6 << 20, dtype=np.float32), "b": np.ones((3 << 20,), np.float32)}, str(path))
    upload_tree(s3.endpoint, path, "fixtures/tmp/big.safetensors")
    proc, requests = run_counted(s3, "ls", s3.url("tmp/big.safetensors"), "--stats", "--format", "json", delay=0)
    assert proc.returncode == 0, proc.stderr
    stats = {v["key"]: v["stats"] for v in json.loads(proc.stdout)["variables"]}
    assert stats["a"]["max"] == (6 << 20) - 1 and stats["b"]["mean"] == 1.0
    size = path.stat().st_size
    from ckptinspect.formats import remote  # noqa: PLC0415

    assert remote.CHUNK_BYTES >= 2 << 20
    assert requests <= 3 + size // remote.CHUNK_BYTES + 2, requests  # 1 MiB reads would be 36+


# -- errors ---------------------------------------------------------------------------------
def test_no_such_bucket_key_and_prefix_in_one_line_without_secrets(s3):
    secret = s3.env["AWS_SECRET_ACCESS_KEY"]
    for url, says in [("s3://no-such-bucket-here/x.safetensors", "no such bucket"),
                      (s3.url("torch/nothing.safetensors"), "no such file"),
                      (s3.url("run/ckpt-99"), "no such file")]:
        result = cli("ls", url)
        assert result.exit_code == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], lines
        assert secret not in result.stderr and secret not in result.stdout


def test_a_connection_lost_mid_read_is_retried(s3):
    s3.proxy.cut(1)  # the next GET loses its connection after the headers
    far = cli("ls", s3.url("torch/model.safetensors"), "--stats", "--format", "json")
    assert far.exit_code == 0, far.stderr
    near = cli("ls", str(FIXTURES / "torch/model.safetensors"), "--stats", "--format", "json")
    assert same(far.stdout, "s3://fixtures/") == same(near.stdout, str(FIXTURES) + "/")


@pytest.mark.slow
def test_a_connection_that_keeps_dropping_is_one_error_line_in_bounded_time(s3):
    s3.proxy.cut(10_000)
    start = time.monotonic()
    result = cli("ls", s3.url("torch/model.safetensors"))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: s3://fixtures/torch/model.safetensors"), lines
    assert s3.env["AWS_SECRET_ACCESS_KEY"] not in result.stderr
    assert time.monotonic() - start < 90


def test_missing_extra_is_one_error_line_naming_it(s3, tmp_path):
    """Without s3fs (hidden from a fresh process), an s3:// path names the extra to install."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "s3fs.py").write_text("raise ImportError('s3fs hidden by the test')\n")
    env = {**s3.env, "PYTHONPATH": f"{hide}:{s3.env.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "ls", s3.url("torch/model.safetensors")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ckptinspect[s3]" in lines[0], lines


@pytest.mark.slow
def test_access_denied_in_one_line_without_secrets():
    """A server that checks credentials (moto with authentication on) refusing unknown keys."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from object_store import DUMMY_ENV, moto_server  # noqa: PLC0415

    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        env = {**DUMMY_ENV, "AWS_ENDPOINT_URL": endpoint}
        import os  # noqa: PLC0415

        proc = subprocess.run([sys.executable, "-m", "ckptinspect", "ls", "s3://fixtures/torch/model.safetensors"],
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "access denied" in lines[0], lines
    assert DUMMY_ENV["AWS_SECRET_ACCESS_KEY"] not in proc.stderr


# -- outputs on the object store ----------------------------------------------------------------
@pytest.mark.parametrize(("rel", "out"), some([("run/ckpt-8", "weights"), ("torch/state_dict.pt", "w.npz"),
                                               ("keras/model.h5", "k.h5"), ("torch/model.safetensors", "m.safetensors")],
                                              {"run/ckpt-8"}))
def test_extract_to_the_object_store_gives_what_it_gives_locally(s3, tmp_path, rel, out):
    dest = f"s3://fixtures/outputs/{tmp_path.name}/{out}"
    far = cli("extract", s3.url(rel), "-o", dest, "--format", "json")
    near = cli("extract", str(FIXTURES / rel), "-o", str(tmp_path / out), "--format", "json")
    assert far.exit_code == near.exit_code == 0, far.stderr
    # remote sources stream instead of copying files; outputs record their source's name (longer here)
    strip = ("seconds", "copied", "copied_bytes", "source_file_bytes", "output_file_bytes", "saving")
    a, b = json.loads(far.stdout), json.loads(near.stdout)
    for d in (a, b):
        for k in strip:
            d.pop(k, None)
    far_roots, near_roots = (dest[: -len(out)], "s3://fixtures/"), (str(tmp_path) + "/", str(FIXTURES) + "/")
    assert same(json.dumps(a), *far_roots) == same(json.dumps(b), *near_roots)
    listed = cli("ls", dest, "--stats", "--format", "json")
    local = cli("ls", str(tmp_path / out), "--stats", "--format", "json")
    assert json.loads(same(listed.stdout, *far_roots))["variables"] == json.loads(same(local.stdout, *near_roots))["variables"]
    assert cli("diff", dest, str(tmp_path / out)).exit_code == 0
    # --force rules as locally: refused without it, replaced with it, never another kind
    again = cli("extract", s3.url(rel), "-o", dest)
    assert again.exit_code == 2 and "output exists" in again.stderr
    assert cli("extract", s3.url(rel), "-o", dest, "--force").exit_code == 0


def test_an_output_never_replaces_an_input_or_another_kind(s3, tmp_path):
    src = s3.url("torch/model.safetensors")
    result = cli("extract", src, "-o", src, "--force")
    assert result.exit_code == 2 and "refusing to overwrite an input" in result.stderr
    result = cli("extract", s3.url("run/ckpt-8"), "-o", s3.url("keras/model.h5"), "--to", "npz", "--force")
    assert result.exit_code == 2 and "--force replaces only an earlier output of the same kind" in result.stderr
    result = cli("extract", s3.url("run/ckpt-8"), "-o", s3.url("run/other"))
    assert result.exit_code == 2 and "source checkpoint's directory" in result.stderr


@pytest.mark.slow
def test_average_and_rewrite_to_the_object_store(s3, tmp_path):
    """average and rewrite of remote TF bundles, written to the store: what they write locally."""
    out = f"s3://fixtures/outputs/{tmp_path.name}"
    sources = [s3.url("run/ckpt-4"), s3.url("run/ckpt-8")]
    far = cli("average", *sources, "-o", f"{out}/avg", "--format", "json")
    near = cli("average", str(FIXTURES / "run/ckpt-4"), str(FIXTURES / "run/ckpt-8"), "-o", str(tmp_path / "avg"),
               "--format", "json")
    assert far.exit_code == near.exit_code == 0, far.stderr
    a, b = json.loads(far.stdout), json.loads(near.stdout)
    assert [p.rsplit("/", 1)[1] for p in a["files"]] == [p.rsplit("/", 1)[1] for p in b["files"]]
    assert a["variables"] == b["variables"]
    assert cli("diff", f"{out}/avg", str(tmp_path / "avg")).exit_code == 0
    far = cli("rewrite", s3.url("run/ckpt-8"), "-o", f"{out}/rw", "--drop", "optimizer/.*")
    near = cli("rewrite", str(FIXTURES / "run/ckpt-8"), "-o", str(tmp_path / "rw"), "--drop", "optimizer/.*")
    assert far.exit_code == near.exit_code == 0, far.stderr
    assert cli("diff", f"{out}/rw", str(tmp_path / "rw")).exit_code == 0
    assert cli("verify", f"{out}/rw").exit_code == 0


# -- metadata spread through a file: fetched together ---------------------------------------
def test_npz_member_headers_are_fetched_in_few_coalesced_ranges(s3, tmp_path):
    """An .npz of 60 arrays of 32 KiB: each member's local header and .npy header lie 32 KiB
    apart; they are fetched as a few merged ranges (gaps under a window are bridged), not one
    GET per member. The listing is the local one."""
    np = pytest.importorskip("numpy")
    from object_store import upload_tree  # noqa: PLC0415

    path = tmp_path / "many.npz"
    np.savez(path, **{f"w{i:03d}": np.full(8192, i, np.float32) for i in range(60)})
    upload_tree(s3.endpoint, path, f"fixtures/tmp/{tmp_path.name}/many.npz")
    url = s3.url(f"tmp/{tmp_path.name}/many.npz")
    proc, requests = run_counted(s3, "ls", url, "--format", "json", delay=0)
    assert proc.returncode == 0, proc.stderr
    near = cli("ls", str(path), "--format", "json")
    assert same(proc.stdout, url) == same(near.stdout, str(path))
    assert len(json.loads(proc.stdout)["variables"]) == 60
    assert requests <= 5, requests  # a LIST, the head, the tail (central directory), the headers' range(s); was 63


def test_hdf5_object_headers_of_sibling_groups_are_fetched_together(s3, tmp_path):
    """A Keras-style HDF5 file of 40 groups whose metadata lies beside each one's 195 KiB of data
    (farther apart than a window and the gap bridged), with a second hard link to a group and a
    link back up (a cycle): entering a group, the walk fetches its children's object headers
    together (several requests in flight; h5py alone reads them one after another), and lists
    what the local file lists, in the same order."""
    np = pytest.importorskip("numpy")
    h5py = pytest.importorskip("h5py")
    from object_store import upload_tree  # noqa: PLC0415

    path = tmp_path / "spread.weights.h5"
    with h5py.File(path, "w") as f:
        for i in range(40):
            f.create_dataset(f"layers/g_{i:02d}/vars/0", data=np.full(50000, i, np.float32))
        f["alias"] = f["layers/g_03"]
        f["layers/g_00/up"] = f["layers"]
    upload_tree(s3.endpoint, path, f"fixtures/tmp/{tmp_path.name}/spread.weights.h5")
    url = s3.url(f"tmp/{tmp_path.name}/spread.weights.h5")
    proc, requests = run_counted(s3, "ls", url, "--format", "json", delay=0.02)
    assert proc.returncode == 0, proc.stderr
    near = cli("ls", str(path), "--format", "json")
    assert same(proc.stdout, url) == same(near.stdout, str(path))
    assert len(json.loads(proc.stdout)["variables"]) == 40
    assert s3.proxy.most_in_flight >= 4, s3.proxy.most_in_flight  # was 1: one object header after another
    assert requests <= 51, requests  # as many as one by one (51): a window per group, the metadata is spread through the file
