"""Keras 3 Orbax checkpoints (formats/orbax): what ckptinspect reads from the fixtures Keras 3 on JAX
wrote (fixtures/orbax/make_fixtures.py) equals what Orbax's own restore gave (expected.json) and
what tensorstore reads directly (the oracle); runs, verify, and hostile copies."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

ts = pytest.importorskip("tensorstore")

import ckptinspect  # noqa: E402
from ckptinspect import errors  # noqa: E402
from ckptinspect.formats import list_directory, open_checkpoint, prepare_check  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "orbax"
EXPECTED = json.loads((FIX / "expected.json").read_text())
RUN = FIX / "model_parallel" / "run"
MULTI = FIX / "multiprocess"
NAN_RUN = FIX / "nan_run"

CASES = [("model_parallel/run", RUN, s) for s in ("3", "6")] + [("multiprocess", MULTI, s) for s in ("2", "4")] + [
    ("nan_run", NAN_RUN, "3")]


def _sha(value: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()).hexdigest()


def _oracle(step: pathlib.Path, key: str) -> np.ndarray:
    spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{step / 'pytree'}/", "path": key + "/"}}
    return ts.open(spec, open=True).result().read().result()


@pytest.mark.parametrize("group,run,step", CASES, ids=[f"{g}/{s}" for g, _, s in CASES])
def test_step_reads_what_orbax_restored(group, run, step):
    expected = EXPECTED[group][step]
    with open_checkpoint(str(run / step)) as ckpt:
        assert ckpt.format == "orbax"
        assert sorted(v.key for v in ckpt.variables) == sorted(expected["arrays"])
        for v in ckpt.variables:
            want = expected["arrays"][v.key]
            assert list(v.shape) == want["shape"] and v.dtype == want["dtype"], v.key
            value = ckpt.read(v)
            assert _sha(value) == want["sha256"], v.key
            np.testing.assert_array_equal(value, _oracle(run / step, v.key))
            group_name = want["group"]
            role = {"trainable_variables": "model", "non_trainable_variables": "model",
                    "optimizer_variables": "optimizer", "metrics_variables": "metadata"}[group_name]
            assert v.role == role
            spec = want["partition_spec"]
            shown = ckpt.info.get("partition_specs", {}).get(v.key)
            if spec is None:  # one device: no mesh
                assert shown is None
            else:
                assert shown == "(" + ", ".join(repr(p) for p in spec) + (",)" if len(spec) == 1 else ")")
        # the step rule: the training step is the optimizer's iterations; the directory's number
        # is the checkpoint's number (Orbax saved it under that number)
        assert (ckpt.step, ckpt.step_source) == (expected["iterations"], f"optimizer:{ckpt.info['iterations_key']}")
        assert (ckpt.number, ckpt.number_source) == (int(step), "name:checkpoint")


def test_names_roles_mesh_and_times():
    with open_checkpoint(str(RUN / "6")) as ckpt:
        kernel = ckpt["sequential/dense_1/kernel"]
        assert kernel.key == "trainable_variables.sequential.dense_1.kernel"
        assert kernel.shape == (32, 32) and kernel.nbytes == 32 * 32 * 4
        assert ckpt["optimizer/adam/iteration"].role == "optimizer"
        assert ckpt["metrics/loss/total"].role == "metadata"
        assert ckpt["sequential/batch_normalization/moving_mean"].role == "model"
        assert ckpt.info["partition_specs"][kernel.key] == "(None, 'model')"
        assert ckpt.info["mesh"] == "batch=2, model=2"
        assert ckpt.info["model_class"] == "Sequential" and ckpt.info["layer_count"] == 3
        assert ckpt.info["optimizer_class"] == "Adam"
        assert ckpt.info["date_committed"] >= ckpt.info["date_saved"]
        assert ckpt.info["committed"] is True


@pytest.mark.parametrize("step", ["2", "4"])
def test_shards_are_the_process_databases_holding_chunks(step):
    owners: dict[str, set[int]] = {}
    for n in (0, 1):
        kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{MULTI / step / 'pytree' / f'ocdbt.process_{n}'}/"}).result()
        for k in kv.list().result():
            name, sep, _ = k.decode().partition("/c")
            if sep:
                owners.setdefault(name, set()).add(n)
    with open_checkpoint(str(MULTI / step)) as ckpt:
        assert ckpt.num_shards == 2 and ckpt.info["processes"] == [0, 1]
        for v in ckpt.variables:
            assert set(v.shards) == owners[v.key], v.key
        # the model axis splits each dense kernel between the two hosts' devices
        assert ckpt["sequential/dense_1/kernel"].shards == (0, 1)


def test_blocks_stream_in_bounded_pieces():
    with open_checkpoint(str(RUN / "6")) as ckpt:
        for v in ckpt.variables:
            for elements in (7, 100, 1 << 20):
                blocks = [np.array(b) for b in ckpt.iter_blocks(v, elements)]
                assert all(b.size <= max(elements, 1) or v.shape == () for b in blocks)
                np.testing.assert_array_equal(np.concatenate(blocks).reshape(v.shape), ckpt.read(v))


STREAM_CASES = CASES + [("nan_run", NAN_RUN, s) for s in ("1", "2")]  # 1, 2: chunks in data files, not inline


@pytest.mark.parametrize("group,run,step", STREAM_CASES, ids=[f"{g}/{s}" for g, _, s in STREAM_CASES])
def test_streamed_blocks_equal_tensorstores_reads(group, run, step):
    # Arrays chunked along their first axis only are streamed from their zstd frames (the others,
    # split on another axis, through tensorstore): both equal tensorstore's own read, bit for bit.
    streamed = 0
    with open_checkpoint(str(run / step)) as ckpt:
        for v in ckpt.variables:
            streamed += ckpt.source._arrays[v.key].rows is not None
            want = _oracle(run / step, v.key).reshape(-1)
            for elements in (1, 5, 1 << 18):
                got = np.concatenate([np.array(b) for b in ckpt.iter_blocks(v, elements)])
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (v.key, elements)
    assert streamed >= 14


def test_diff_of_steps_stored_as_orbax_writes_them_imports_no_tensorstore():
    # nan_run's arrays are all stored as whole rows of chunks (one device): diff streams every one
    probe = """
import sys
import ckptinspect
report = ckptinspect.diff(sys.argv[1], sys.argv[2])
print(len(report.variables), sorted(m for m in sys.modules if m.split(".")[0] == "tensorstore"))
"""
    out = subprocess.run([sys.executable, "-c", probe, str(NAN_RUN / "1"), str(NAN_RUN / "2")], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.stdout.split(" ", 1) == ["26", "[]\n"], out.stderr


def test_streamed_chunk_that_does_not_decode_is_one_clean_error(tmp_path):
    step = _copy(NAN_RUN / "2", tmp_path)
    with open_checkpoint(str(step)) as ckpt:
        # a chunk in a data file (not inline in the B+tree node): change a byte of its zstd frame
        var = next(v for v in ckpt.variables if (ckpt.source._arrays[v.key].rows or [None])[0] is not None
                   and ckpt.source._arrays[v.key].rows[0].inline is None)
        ref = ckpt.source._arrays[var.key].rows[0]
    path = step / "pytree" / ref.path
    raw = bytearray(path.read_bytes())
    raw[ref.offset + 12] ^= 0xFF
    path.write_bytes(bytes(raw))
    with open_checkpoint(str(step)) as ckpt:
        with pytest.raises(errors.CorruptCheckpointError, match=var.key):
            list(ckpt.iter_blocks(ckpt[var.name], 1 << 16))


def test_run_directory_is_a_series_with_the_interrupted_save_named():
    listing = list_directory(str(RUN))
    assert [c.number for c in listing.checkpoints] == [3, 6]
    assert listing.latest == str(RUN / "6")
    assert any("9.orbax-checkpoint-tmp" in n and "interrupted" in n for n in listing.notes)
    assert any("no checksum" in n for n in listing.notes)
    with open_checkpoint(str(RUN)) as ckpt:
        assert ckpt.path == str(RUN / "6") and len(ckpt.checkpoints) == 2


def test_run_listing_reads_each_steps_training_step_and_plan_gets_a_step_cadence():
    from ckptinspect.ops.plan.measure import measure  # noqa: PLC0415

    listing = list_directory(str(RUN))
    want = [EXPECTED["model_parallel/run"][c]["iterations"] for c in ("3", "6")]
    assert [c.step for c in listing.checkpoints] == want == [3, 6]
    assert [c.step for c in list_directory(str(RUN), steps=False).checkpoints] == [None, None]
    cadence = measure(str(RUN)).cadence
    assert cadence is not None and cadence.interval_steps == 3


def test_verify_run_intact_and_interrupted_step_damaged():
    report = ckptinspect.verify(str(RUN))
    assert report.intact and len(report.checkpoints) == 2
    assert any("interrupted" in n for n in report.notes)
    step_report = ckptinspect.verify(str(RUN / "6"))
    assert step_report.intact and any("not the chunk data" in n for n in step_report.notes)
    _, check = prepare_check(str(RUN / "9.orbax-checkpoint-tmp"))
    result = check.run()
    assert result.status == "damaged"
    assert any("interrupted save" in p for p in result.problems)


def _copy(src: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    out = tmp_path / src.name
    shutil.copytree(src, out)
    return out


def test_missing_process_database(tmp_path):
    step = _copy(MULTI / "4", tmp_path)
    shutil.rmtree(step / "pytree" / "ocdbt.process_1")
    _, check = prepare_check(str(step))
    result = check.run()
    assert result.status == "damaged"
    assert any("ocdbt.process_1: missing" in p for p in result.problems)
    # the arrays with chunks stored in process 1's data files (not inline in the joined b-tree)
    # cannot be read any more: which ones, tensorstore's own dump of the joined database says
    base = ts.KvStore.open(f"file://{MULTI / '4' / 'pytree'}/").result()
    root = ts.ocdbt.dump(base).result()["versions"][-1]["root"]["location"]
    in_process_1 = {e["key"].decode().partition("/c")[0] for e in ts.ocdbt.dump(base, root).result()["entries"]
                    if "ocdbt.process_1/" in e.get("indirect_value", "")}
    assert in_process_1
    assert {d.key for d in result.damaged} == in_process_1


def _data_files(step: pathlib.Path) -> list[pathlib.Path]:
    return sorted((step / "pytree").glob("ocdbt.process_*/d/*"))


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_special_file_in_place_of_a_data_file_is_refused(tmp_path, kind):
    step = _copy(MULTI / "4", tmp_path)
    target = _data_files(step)[0]
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    with pytest.raises(errors.UnsafeFileError, match="not a regular file"):
        open_checkpoint(str(step))


def test_tree_name_leaving_the_checkpoint_is_refused(tmp_path):
    step = _copy(RUN / "6", tmp_path)
    meta_path = step / "pytree" / "_METADATA"
    meta = json.loads(meta_path.read_text())
    tree = meta["tree_metadata"]
    key = next(iter(tree))
    tree["('trainable_variables', '..', 'etc', 'passwd')"] = tree.pop(key)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(errors.UnsafeFileError, match="could leave"):
        open_checkpoint(str(step))


def test_deep_tree_path_is_refused(tmp_path):
    step = _copy(RUN / "6", tmp_path)
    meta_path = step / "pytree" / "_METADATA"
    meta = json.loads(meta_path.read_text())
    meta["tree_metadata"][repr(tuple(f"p{i}" for i in range(500)))] = {"value_metadata": {"value_type": "jax.Array"}}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(errors.UnsafeFileError, match="deep"):
        open_checkpoint(str(step))


def test_tree_naming_an_array_the_database_lacks(tmp_path):
    step = _copy(RUN / "6", tmp_path)
    meta_path = step / "pytree" / "_METADATA"
    meta = json.loads(meta_path.read_text())
    meta["tree_metadata"]["('trainable_variables', 'ghost', 'kernel')"] = {"value_metadata": {"value_type": "jax.Array"}}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(errors.CorruptCheckpointError, match="not in the database"):
        open_checkpoint(str(step))
    _, check = prepare_check(str(step))
    result = check.run()
    assert result.status == "damaged" and [d.key for d in result.damaged] == ["trainable_variables.ghost.kernel"]


def _rewrite_zarr_json(step: pathlib.Path, key: str, edit) -> None:
    """Write a lying zarr.json into the step's OCDBT database with tensorstore itself."""
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{step / 'pytree'}/"}).result()
    meta = json.loads(kv.read(f"{key}/zarr.json").result().value)
    edit(meta)
    kv.write(f"{key}/zarr.json", json.dumps(meta).encode()).result()


def test_declared_shape_of_10_to_the_30_is_refused(tmp_path):
    step = _copy(RUN / "6", tmp_path)
    key = "trainable_variables.sequential.dense_1.kernel"
    _rewrite_zarr_json(step, key, lambda meta: meta.update(shape=[10**30, 64]))
    with pytest.raises(errors.CorruptCheckpointError, match="shape"):
        open_checkpoint(str(step))
    _, check = prepare_check(str(step))
    result = check.run()
    assert result.status == "damaged" and any(d.key == key for d in result.damaged)


def test_declared_dtype_that_lies_about_the_chunks(tmp_path):
    step = _copy(RUN / "6", tmp_path)
    key = "trainable_variables.sequential.dense_2.kernel"
    _rewrite_zarr_json(step, key, lambda meta: meta.update(data_type="float64"))  # the chunks hold float32
    with open_checkpoint(str(step)) as ckpt:
        assert ckpt.variables[[v.key for v in ckpt.variables].index(key)].dtype == "float64"
    _, check = prepare_check(str(step))
    result = check.run()
    assert result.status == "damaged"
    assert [d.key for d in result.damaged] == [key] and result.damaged[0].kind == "unreadable"


def test_garbage_manifest_is_one_clean_error(tmp_path):
    step = _copy(RUN / "6", tmp_path)
    (step / "pytree" / "manifest.ocdbt").write_bytes(b"\x00" * 200)
    with pytest.raises(errors.CorruptCheckpointError, match="OCDBT database cannot be opened: .*not OCDBT data"):
        open_checkpoint(str(step))


# -- the OCDBT reader the listing uses (formats/orbax/ocdbt.py) against tensorstore's ------------
def _databases() -> list[pathlib.Path]:
    joined = sorted(p.parent for p in FIX.rglob("pytree/manifest.ocdbt"))
    return joined + sorted(p.parent for p in FIX.rglob("ocdbt.process_*/manifest.ocdbt"))


def _ts_items(base: pathlib.Path) -> dict[bytes, bytes]:
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{base}/"}).result()
    return {k: bytes(kv.read(k).result().value) for k in kv.list().result()}


def test_ocdbt_reader_lists_and_reads_what_tensorstore_does():
    from ckptinspect.formats.orbax.ocdbt import open_database

    bases = _databases()
    assert len(bases) >= 14 and any("ocdbt.process_1" in str(b) for b in bases)
    for base in bases:
        db = open_database(str(base))
        mine = {k: db.read_value(ref) for k, ref in db.items()}
        assert mine == _ts_items(base), base


def test_ocdbt_reader_reads_the_newest_version_after_a_rewrite(tmp_path):
    from ckptinspect.formats.orbax.ocdbt import open_database

    step = _copy(RUN / "6", tmp_path)
    _rewrite_zarr_json(step, "trainable_variables.sequential.dense_2.kernel", lambda meta: meta.update(data_type="float64"))
    db = open_database(str(step / "pytree"))
    mine = {k: db.read_value(ref) for k, ref in db.items()}
    assert mine == _ts_items(step / "pytree")
    assert b'"float64"' in mine[b"trainable_variables.sequential.dense_2.kernel/zarr.json"]


def test_scalars_decoded_from_their_entries_equal_tensorstores_reads():
    from ckptinspect.formats.orbax.ocdbt import open_database
    from ckptinspect.formats.orbax.step import scalar_from_entry

    checked = 0
    for base in _databases()[:6]:
        items = _ts_items(base)
        for key, raw in items.items():
            if not key.endswith(b"/zarr.json"):
                continue
            meta = json.loads(raw)
            name = key[: -len(b"/zarr.json")].decode()
            if meta["shape"] != [] or name.encode() + b"/c" not in items:
                continue
            got = scalar_from_entry(meta, items[name.encode() + b"/c"], name)
            assert got == float(_oracle(base.parent, name)), (base, name)
            checked += 1
    assert checked >= 20


def _ocdbt_manifest(path: bytes, offset: int = 0, length: int = 64) -> bytes:
    """An uncompressed OCDBT manifest (tensorstore's format, index.rst) naming one data file."""
    import google_crc32c

    def varint(n: int) -> bytes:
        out = b""
        while True:
            b, n = n & 0x7F, n >> 7
            out += bytes([b | (0x80 if n else 0)])
            if not n:
                return out

    body = b"\x00" * 16 + b"\x00" + varint(1024) + varint(1 << 20) + b"\x04" + varint(0)  # config, no compression
    body += varint(1) + varint(len(path)) + varint(0) + path  # the data file table
    body += varint(1) + varint(1) + b"\x00" + varint(0) + varint(offset) + varint(length)  # one version
    body += varint(1) + varint(length) + varint(0) + (0).to_bytes(8, "little") + varint(0)  # statistics, no nodes
    head = (0x0CDB3A2A).to_bytes(4, "big")
    rest = varint(0) + varint(0) + body  # version 0, uncompressed
    raw = head + (4 + 8 + len(rest) + 4).to_bytes(8, "little") + rest
    return raw + google_crc32c.value(raw).to_bytes(4, "little")


@pytest.mark.parametrize("path,error", [(b"../../outside/d/x", errors.UnsafeFileError),
                                        (b"/etc/passwd", errors.UnsafeFileError),
                                        (b"d/missing", errors.CkptError)])
def test_ocdbt_manifest_naming_files_outside_or_missing(tmp_path, path, error):
    step = _copy(RUN / "6", tmp_path)
    (step / "pytree" / "manifest.ocdbt").write_bytes(_ocdbt_manifest(path))
    with pytest.raises(error):
        open_checkpoint(str(step))


def test_ocdbt_manifest_or_node_changed_is_one_clean_error(tmp_path):
    step = _copy(RUN / "6", tmp_path)
    manifest = step / "pytree" / "manifest.ocdbt"
    raw = bytearray(manifest.read_bytes())
    raw[20] ^= 0x01
    manifest.write_bytes(bytes(raw))
    with pytest.raises(errors.CorruptCheckpointError, match="checksum mismatch"):
        open_checkpoint(str(step))
    manifest.write_bytes((RUN / "6" / "pytree" / "manifest.ocdbt").read_bytes()[:-9])  # cut short
    with pytest.raises(errors.CorruptCheckpointError, match="declares .* bytes"):
        open_checkpoint(str(step))
    shutil.copy(RUN / "6" / "pytree" / "manifest.ocdbt", manifest)
    node_file = next((step / "pytree" / "d").iterdir())
    raw = bytearray(node_file.read_bytes())
    raw[30] ^= 0x40
    node_file.write_bytes(bytes(raw))
    with pytest.raises(errors.CorruptCheckpointError):
        open_checkpoint(str(step))


def test_array_metadatas_are_not_where_the_bytes_are():
    # Why the shards column lists each process' database and does not read array_metadatas/process_N:
    # process 1 lists every array there, also the replicated ones whose chunks only process 0 wrote.
    listed = {e["array_metadata"]["param_name"] for e in
              json.loads((MULTI / "4" / "pytree" / "array_metadatas" / "process_1").read_text())["array_metadatas"]}
    held = {k.decode().partition("/c")[0] for k in _ts_items(MULTI / "4" / "pytree" / "ocdbt.process_1") if b"/c" in k}
    assert held < listed
    with open_checkpoint(str(MULTI / "4")) as ckpt:
        assert {v.key for v in ckpt.variables if 1 in v.shards} == held


def test_input_never_modified():
    before = {p: p.stat().st_mtime_ns for p in (RUN / "6").rglob("*")}
    with open_checkpoint(str(RUN / "6")) as ckpt:
        for v in ckpt.variables:
            ckpt.read(v)
    assert before == {p: p.stat().st_mtime_ns for p in (RUN / "6").rglob("*")}


LS_IMPORTS = """
import sys
from ckptinspect.__main__ import run
sys.argv = ["ckptinspect", "ls", sys.argv[1]]
try:
    run()
except SystemExit:
    pass
finally:
    print("HEAVY", sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "orbax", "tensorflow", "torch")))
"""


def test_ls_imports_neither_jax_nor_orbax():
    out = subprocess.run([sys.executable, "-c", LS_IMPORTS, str(RUN / "6")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert "sequential/dense_1/kernel" in out.stdout
    assert "HEAVY []" in out.stdout


NO_TENSORSTORE = """
import sys
sys.modules["tensorstore"] = None
from ckptinspect.__main__ import run
sys.argv = ["ckptinspect", "ls", sys.argv[1]]
run()
"""


def _ls(*args: str, without: str | None = None) -> subprocess.CompletedProcess:
    script = NO_TENSORSTORE.replace('"tensorstore"', repr(without)) if without else NO_TENSORSTORE.replace(
        'sys.modules["tensorstore"] = None', "")
    script = script.replace('["ckptinspect", "ls", sys.argv[1]]', "['ckptinspect', *sys.argv[1:]]")
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_ls_lists_without_tensorstore_and_values_name_the_extra():
    # ls reads names, shapes, dtypes, shards, the step and the times without tensorstore: the same
    # output as with it; a value (ls --stats) needs it, and says so in one line.
    for step in (RUN / "6", MULTI / "4"):
        with_ts = _ls("ls", "--format", "json", str(step))
        without = _ls("ls", "--format", "json", str(step), without="tensorstore")
        assert with_ts.returncode == 0 and without.returncode == 0, without.stderr
        assert json.loads(without.stdout) == json.loads(with_ts.stdout)
        assert json.loads(without.stdout)["step"] == int(step.name)
    out = _ls("ls", "--stats", str(RUN / "6"), without="tensorstore")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and "pip install 'ckptinspect[orbax]'" in lines[0]


def test_ls_imports_no_tensorstore_and_without_zstandard_names_the_extra():
    probe = LS_IMPORTS.replace('("jax", "jaxlib", "orbax", "tensorflow", "torch")', '("tensorstore", "numpy")')
    out = subprocess.run([sys.executable, "-c", probe, str(RUN / "6")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert "sequential/dense_1/kernel" in out.stdout and "HEAVY []" in out.stdout
    out = _ls("ls", str(RUN / "6"), without="zstandard")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "zstandard" in lines[0] and "pip install 'ckptinspect[orbax]'" in lines[0]


def test_orbax_fixtures_are_small():
    # Orbax writes a few small files per step whatever the model (metadata, sharding, manifests,
    # one b-tree per process database): the folder has its own bound, as fixtures/series does.
    assert sum(p.stat().st_size for p in FIX.rglob("*") if p.is_file()) < 700 * 1024


def test_every_value_has_its_declared_shape_scalars_included(tmp_path):
    """Orbax stores a scalar (a metric's count) as one element of shape [1]: read() gives the
    declared shape (), so rewrite to safetensors takes the whole step (it refused on the
    scalar: 'read float32[1], expected float32[]')."""
    with open_checkpoint(str(RUN / "6")) as ckpt:
        scalars = [v for v in ckpt.variables if v.shape == ()]
        assert scalars
        for v in ckpt.variables:
            assert ckpt.read(v).shape == tuple(v.shape), v.name
    out = tmp_path / "step6.safetensors"
    from click.testing import CliRunner  # noqa: PLC0415

    from ckptinspect.cli import app  # noqa: PLC0415

    result = CliRunner().invoke(app, ["rewrite", str(RUN / "6"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with open_checkpoint(str(out)) as written, open_checkpoint(str(RUN / "6")) as ckpt:
        for v in scalars:
            assert written.read(v.name).shape == () and written.read(v.name) == ckpt.read(v)


def test_ocdbt_zstd_bodies_are_bounded():
    import zstandard

    from ckptinspect.formats.orbax.ocdbt import zstd_decompress

    bomb = zstandard.ZstdCompressor().compress(b"\0" * (8 << 20))  # 8 MiB from a few hundred bytes
    assert len(bomb) < 4096
    with pytest.raises(errors.UnsafeFileError, match="more than 1048576 bytes"):
        zstd_decompress(bomb, 1 << 20, "node")
    assert len(zstd_decompress(bomb, 8 << 20, "node")) == 8 << 20
    with pytest.raises(errors.CorruptCheckpointError, match="does not decode|cut short"):
        zstd_decompress(bomb[:40], 1 << 20, "node")


def test_concurrent_reads_only_when_tensorstore_chunks_are_small(monkeypatch):
    from ckptinspect.formats.orbax import step as orbax_step

    with open_checkpoint(str(NAN_RUN / "2")) as ckpt:  # every array streamed
        assert ckpt.source.concurrent_reads
    monkeypatch.setattr(orbax_step, "CONCURRENT_CHUNK_BYTES", 100)
    with open_checkpoint(str(NAN_RUN / "2")) as ckpt:
        assert ckpt.source.concurrent_reads  # streamed arrays hold a few MiB whatever their chunks
    with open_checkpoint(str(RUN / "6")) as ckpt:  # kernels split on the model axis: tensorstore decodes them
        assert not ckpt.source.concurrent_reads
