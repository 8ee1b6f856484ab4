"""Our own HDF5 metadata reader (``formats/keras/hdf5.py``, ``h5_own.py``; issue 28).

* Oracle: on every committed Keras HDF5 fixture, every ``.h5`` / ``.weights.h5`` of the
  real-world folder and the weights member of every ``.keras`` archive, the walk (names,
  shapes, dtypes, sizes, offsets, groups, ``vars`` names), every group attribute the listings
  read, the whole listing and every value equal what h5py gives.
* The listing path imports no h5py for files inside the subset, and files outside it (soft
  links) still get h5py's answer.
* Hostile input: truncated files, offsets past the end, a B-tree reaching one node twice, a
  continuation block that loops, a declared shape bomb: the reader refuses (``Unsupported``,
  so h5py decides) in bounded time, and the command prints one ``Error:`` line.
"""

from __future__ import annotations

import pathlib
import shutil
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

from catalogue import FIXTURES, KERAS
from ckptinspect.cli import app
from ckptinspect.formats.keras import h5 as keras_h5
from ckptinspect.formats.keras import h5_own, h5_walk, hdf5
from ckptinspect.formats.keras.h5_read import _open_file
from ckptinspect.formats.keras.legacy import H5pyAttrs

h5py = pytest.importorskip("h5py")

REALWORLD = pathlib.Path("/work/shared/realworld")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _fixture_files() -> list[pathlib.Path]:
    return sorted(p for p in FIXTURES.rglob("*") if p.suffix == ".h5")


def _realworld_files() -> list[pathlib.Path]:
    if not REALWORLD.is_dir():
        return []
    return sorted(p for p in REALWORLD.rglob("*") if p.suffix in (".h5", ".hdf5") and "broken" not in p.parts)


def _archives() -> list[pathlib.Path]:
    found = sorted(FIXTURES.rglob("*.keras"))
    if REALWORLD.is_dir():
        found += sorted(p for p in REALWORLD.rglob("*.keras") if "broken" not in p.parts)
    return found


def _member(archive: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path | None:
    """The archive's ``model.weights.h5`` written out (None when it has none or is not a zip)."""
    if not zipfile.is_zipfile(archive):
        return archive if h5py.is_hdf5(archive) else None
    with zipfile.ZipFile(archive) as zf:
        if "model.weights.h5" not in zf.namelist():
            return None
        out = tmp_path / (archive.name + ".weights.h5")
        out.write_bytes(zf.read("model.weights.h5"))
        return out


def _assert_walks_equal(path: pathlib.Path) -> h5_own.OwnFile:
    own = h5_own.own_walk(str(path))
    h5 = _open_file(str(path))
    try:
        ref = h5_walk._walk(h5, str(path))
        assert list(own.walk.datasets) == list(ref.datasets)
        for key, want in ref.datasets.items():
            got = own.walk.datasets[key]
            for field in want.__slots__:
                assert getattr(got, field) == getattr(want, field), (key, field)
            # Our reader describes the stored dtype without numpy, field for field as numpy's.
            assert isinstance(got.stored, hdf5.DType), key
            for field in ("str", "kind", "itemsize", "name", "names", "subdtype"):
                assert getattr(got.stored, field) == getattr(want.stored, field), (key, field)
        assert own.walk.groups == ref.groups
        assert own.walk.vars_names == ref.vars_names
        # Every attribute of every group, as the legacy listing reads it.
        attrs = H5pyAttrs(h5)
        for group in ["", *sorted(ref.groups)]:
            obj = h5[group] if group else h5
            names = sorted(obj.attrs)
            assert sorted(n.decode() for n in own.group_attrs[group]) == names, group
            for name in names:
                assert own.has(group, name)
                if obj.attrs.get_id(name).shape is None:
                    continue  # null dataspace: the reader defers to h5py
                assert own.text(group, name) == attrs.text(group, name), (group, name)
                assert own.split(group, name) == attrs.split(group, name), (group, name)
    finally:
        h5.close()
    return own


def _assert_listing_and_values(path: pathlib.Path) -> None:
    ours = keras_h5._own_listing(str(path), str(path))
    assert ours is not None, f"{path} fell back to h5py"
    h5 = _open_file(str(path))
    try:
        ref = keras_h5.list_h5_file(h5, str(path))
    finally:
        h5.close()
    assert ours == ref
    ckpt = keras_h5.open_h5(str(path))
    try:
        h5 = _open_file(str(path))
        try:
            for v in ckpt.variables:
                got = ckpt.source.read(v)
                want = h5[v.key][()]
                assert got.dtype == want.dtype and got.shape == want.shape, v.key
                assert np.array_equal(got, want, equal_nan=got.dtype.kind == "f"), v.key
        finally:
            h5.close()
    finally:
        ckpt.source.close()


@pytest.mark.parametrize("path", _fixture_files() + _realworld_files(), ids=str)
def test_walk_attributes_listing_and_values_equal_h5pys(path):
    _assert_walks_equal(path).close()
    _assert_listing_and_values(path)


@pytest.mark.parametrize("archive", _archives(), ids=str)
def test_keras_archive_members_equal_h5pys(archive, tmp_path):
    member = _member(archive, tmp_path)
    if member is None:
        pytest.skip("no model.weights.h5 member")
    _assert_walks_equal(member).close()
    _assert_listing_and_values(member)


def test_files_h5py_writes_in_other_ways(tmp_path):
    """Compact, chunked, big-endian, bool, fixed and variable strings, new-style (v2) headers
    with link messages, a group of many links (a B-tree of two levels): walked as h5py walks."""
    cases = {}
    for libver in ("earliest", "latest"):
        path = tmp_path / f"{libver}.weights.h5"
        with h5py.File(path, "w", libver=libver) as f:
            g = f.create_group("layers/dense/vars")
            g.attrs["name"] = "dense"
            g.create_dataset("0", data=np.arange(12, dtype=">f4").reshape(3, 4))
            if libver == "earliest":  # (version-4 chunk indexes are left to h5py: below)
                g.create_dataset("1", data=np.arange(3, dtype="<i8"), chunks=(2,))
            g.create_dataset("2", data=np.array([True, False]))
            g.create_dataset("3", data=np.float16(1.5))
            g.create_dataset("4", data=np.array([b"ab", b"cde"]))
            g.create_dataset("5", data=["x", "yz"], dtype=h5py.string_dtype())
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.COMPACT)
            space = h5py.h5s.create_simple((4,))
            h5py.h5d.create(g.id, b"6", h5py.h5t.NATIVE_UINT16, space, dcpl=dcpl).write(
                h5py.h5s.ALL, h5py.h5s.ALL, np.arange(4, dtype=np.uint16))
            many = f.create_group("layers/many/vars")
            for i in range(100 if libver == "earliest" else 6):  # (latest: dense storage past 8 links, h5py's)
                many.create_dataset(str(i), data=np.full(2, i, dtype=np.float32))
            f.create_group("optimizer/vars").create_dataset("0", data=np.int64(7))
        cases[libver] = path
    for path in cases.values():
        _assert_walks_equal(path).close()
        _assert_listing_and_values(path)
    # Outside the subset: the whole file is listed through h5py, the same listing.
    with h5py.File(cases["latest"], "a") as f:
        f["layers/dense/vars"].create_dataset("1", data=np.arange(3, dtype="<i8"), chunks=(2,))
    with pytest.raises(hdf5.Unsupported, match="version 4 of class 2"):
        h5_own.own_walk(str(cases["latest"]))
    assert keras_h5._own_listing(str(cases["latest"]), "x") is None
    ckpt = keras_h5.open_h5(str(cases["latest"]))
    assert [v.key for v in ckpt.variables if v.key.startswith("layers/dense/")] == [f"layers/dense/vars/{i}" for i in range(7)]
    assert ckpt.read(next(v for v in ckpt.variables if v.key == "layers/dense/vars/1")).tolist() == [0, 1, 2]


def test_listing_and_reading_import_no_h5py():
    script = textwrap.dedent(f"""
        import sys
        import ckptinspect
        from ckptinspect.ops.diff.operation import diff
        c = ckptinspect.open({str(KERAS / "model.weights.h5")!r})
        for v in c.variables:
            c.read(v)
        report = diff(c, ckptinspect.open({str(KERAS / "model.h5")!r}))
        assert "h5py" not in sys.modules, "h5py imported"
        print(len(c.variables))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 0


def test_soft_links_still_get_h5pys_refusal(tmp_path):
    path = tmp_path / "soft.weights.h5"
    shutil.copy(KERAS / "model.weights.h5", path)
    with h5py.File(path, "a") as f:
        f["layers/alias"] = h5py.SoftLink("/layers/dense")
    with pytest.raises(hdf5.Unsupported):
        h5_own.own_walk(str(path))
    result = CliRunner().invoke(app, ["ls", str(path)])
    assert result.exit_code != 0
    assert "soft link" in result.output and result.output.count("Error:") == 1


# -- hostile input -------------------------------------------------------------------------
def _patched(tmp_path: pathlib.Path, src: pathlib.Path, patches: list[tuple[int, bytes]], name: str) -> pathlib.Path:
    data = bytearray(src.read_bytes())
    for at, raw in patches:
        data[at : at + len(raw)] = raw
    out = tmp_path / name
    out.write_bytes(bytes(data))
    return out


def _one_error(path: pathlib.Path) -> str:
    result = CliRunner().invoke(app, ["ls", str(path)])
    assert result.exit_code != 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output
    return lines[0]


def test_truncated_file(tmp_path):
    src = KERAS / "model.weights.h5"
    for keep in (64, 200, 2000, src.stat().st_size // 2, src.stat().st_size - 1):
        path = tmp_path / f"cut{keep}.weights.h5"
        path.write_bytes(src.read_bytes()[:keep])
        with pytest.raises(hdf5.Unsupported):
            h5_own.own_walk(str(path))
        _one_error(path)


def test_offsets_past_the_end(tmp_path):
    src = KERAS / "model.weights.h5"
    with hdf5.File(str(src)) as f:
        root = f.root
        assert f.read(0, 8) == hdf5.SIGNATURE and f.read(8, 1) == b"\x00"  # superblock v0
    far = struct.pack("<Q", 1 << 50)
    # The root's object header address in the superblock's root symbol table entry.
    at = 24 + 32 + 8
    assert struct.unpack_from("<Q", src.read_bytes(), at)[0] == root
    path = _patched(tmp_path, src, [(at, far)], "far.weights.h5")
    with pytest.raises(hdf5.Unsupported, match="past the end"):
        h5_own.own_walk(str(path))
    _one_error(path)


def _btree_of(path: pathlib.Path, group: str) -> int:
    with h5py.File(path, "r") as f:
        addr = h5py.h5o.get_info(f[group].id).addr
    with hdf5.File(str(path)) as f:
        body = next(b for t, b, _ in f.messages(addr) if t == 0x11)
        return struct.unpack_from("<Q", body, 0)[0]


def test_btree_reaching_a_node_twice(tmp_path):
    src = tmp_path / "many.weights.h5"
    with h5py.File(src, "w") as f:
        g = f.create_group("layers/many/vars")
        for i in range(200):  # more than 2K symbols: a B-tree of two levels
            g.create_dataset(str(i), data=np.float32(i))
    btree = _btree_of(src, "layers/many/vars")
    raw = src.read_bytes()
    assert raw[btree : btree + 4] == b"TREE" and raw[btree + 5] == 1  # level 1
    count = struct.unpack_from("<H", raw, btree + 6)[0]
    assert count >= 2
    first_child = struct.unpack_from("<Q", raw, btree + 24 + 8)[0]
    second_child_at = btree + 24 + 8 + 8 + 8  # key0, child0, key1, child1
    path = _patched(tmp_path, src, [(second_child_at, struct.pack("<Q", first_child))], "loop.weights.h5")
    with pytest.raises(hdf5.Unsupported, match="twice"):
        h5_own.own_walk(str(path))
    # h5py reads the damaged group as it reads it (the listing is then h5py's, or its error).
    result = CliRunner().invoke(app, ["ls", str(path)])
    assert result.output.count("Error:") <= 1


def test_continuation_block_that_loops(tmp_path):
    src = tmp_path / "attrs.weights.h5"
    with h5py.File(src, "w") as f:
        g = f.create_group("layers/dense/vars")
        g.create_dataset("0", data=np.ones(3, np.float32))
        g.attrs["name"] = "dense"
        for i in range(40):  # more attributes than the first header chunk holds: a continuation
            g.attrs[f"a{i}"] = np.arange(8, dtype=np.float64)
    with h5py.File(src, "r") as f:
        addr = h5py.h5o.get_info(f["layers/dense/vars"].id).addr
    raw = bytearray(src.read_bytes())
    with hdf5.File(str(src)) as f:
        # The v1 header's messages: find the continuation message and point it at the first chunk.
        size = struct.unpack_from("<I", raw, addr + 8)[0]
        at, end = addr + 16, addr + 16 + size
        found = None
        while at + 8 <= end:
            mtype, msize = struct.unpack_from("<HH", raw, at)
            if mtype == 0x10:
                found = at + 8
            at += 8 + msize
        assert found is not None, "no continuation message"
        f.messages(addr)  # the intact file reads
    struct.pack_into("<QQ", raw, found, addr + 16, size)
    path = tmp_path / "loop.weights.h5"
    path.write_bytes(bytes(raw))
    with pytest.raises(hdf5.Unsupported, match="loops"):
        h5_own.own_walk(str(path))


def test_huge_declared_dataspace(tmp_path):
    path = tmp_path / "bomb.weights.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.ones(3, np.float32))
        f.create_dataset("layers/big/vars/0", shape=(1 << 39,), dtype=np.float32)  # 2 TiB declared, never written
    with pytest.raises(hdf5.Unsupported, match="declares"):
        h5_own.own_walk(str(path))
    line = _one_error(path)
    assert "shape bomb" in line


def test_huge_dimension_patched_into_a_dataspace(tmp_path):
    """A dataspace whose dimension says 2**62 elements: refused from the metadata alone."""
    src = KERAS / "model.weights.h5"
    raw = bytearray(src.read_bytes())
    with hdf5.File(str(src)) as f:
        own = h5_own._own_walk(f)
        key, ds = next((k, d) for k, d in own.walk.datasets.items() if len(d.shape) == 1 and d.shape[0] > 1)
    # The dataset's dimension, stored little-endian as 8 bytes, is patched where it occurs once
    # inside a dataspace message (version 1 header: dims follow 8 bytes of prefix).
    needle = struct.pack("<Q", ds.shape[0])
    hits = [i for i in range(len(raw) - 8) if raw[i : i + 8] == needle and raw[i - 8] == 1 and raw[i - 7] == 1]
    assert hits
    for at in hits:
        raw[at : at + 8] = struct.pack("<Q", 1 << 62)
    path = tmp_path / "huge.weights.h5"
    path.write_bytes(bytes(raw))
    with pytest.raises(hdf5.Unsupported):
        h5_own.own_walk(str(path))
    _one_error(path)
