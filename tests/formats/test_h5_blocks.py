"""Streamed blocks of HDF5 datasets equal what h5py reads, whichever way they are read:
contiguous datasets straight from the file at their offset (pooled ``pread``), chunked or
filtered ones as hyperslabs through h5py."""

from __future__ import annotations

import numpy as np
import pytest

import ckptinspect

h5py = pytest.importorskip("h5py")

BLOCK = 7  # elements per block: blocks that straddle rows, and a short last block


def _write(path):
    rng = np.random.default_rng(3)
    values = {
        "layers/dense/vars/0": rng.standard_normal((13, 11)).astype("<f4"),
        "layers/dense/vars/1": rng.standard_normal(11).astype(">f4"),  # big-endian on disk
        "layers/emb/vars/0": rng.integers(-(2**40), 2**40, (5, 9)).astype("<i8"),
        "layers/flag/vars/0": rng.integers(0, 2, 17).astype(bool),
        "layers/zip/vars/0": rng.standard_normal((20, 6)),  # chunked + gzip: through h5py
    }
    with h5py.File(path, "w") as f:
        for key, value in values.items():
            if key.startswith("layers/zip"):
                f.create_dataset(key, data=value, chunks=(4, 6), compression="gzip")
            else:
                f.create_dataset(key, data=value)
    return values


def test_blocks_equal_h5py_values(tmp_path):
    path = tmp_path / "model.weights.h5"
    values = _write(path)
    with h5py.File(path, "r") as f:
        assert f["layers/dense/vars/0"].id.get_offset() is not None  # the direct path is taken
        assert f["layers/zip/vars/0"].id.get_offset() is None  # and the h5py one
        truth = {k: f[k][()] for k in values}
    with ckptinspect.open(str(path)) as ckpt:
        for var in ckpt:
            for _ in range(2):  # twice, as diff streams a variable (the dataset is reused)
                blocks = [np.array(b, copy=True) for b in ckpt.iter_blocks(var, BLOCK)]
                assert all(b.size <= BLOCK for b in blocks)
                got = np.concatenate(blocks).reshape(var.shape)
                assert got.dtype.kind == truth[var.key].dtype.kind
                np.testing.assert_array_equal(got, truth[var.key], err_msg=var.key)


def test_direct_blocks_see_the_bytes_on_disk(tmp_path):
    """A byte changed in the file at the dataset's offset shows in the streamed values."""
    path = tmp_path / "model.weights.h5"
    _write(path)
    with h5py.File(path, "r") as f:
        offset = f["layers/dense/vars/0"].id.get_offset()
    raw = bytearray(path.read_bytes())
    raw[offset : offset + 4] = np.float32(1234.5).tobytes()
    path.write_bytes(bytes(raw))
    with ckptinspect.open(str(path)) as ckpt:
        first = next(ckpt.iter_blocks("layers/dense/vars/0", BLOCK))
        assert first[0] == np.float32(1234.5)
    with h5py.File(path, "r") as f:
        assert f["layers/dense/vars/0"][0, 0] == np.float32(1234.5)


def _blocks(ck, key):
    return np.concatenate([b.copy() for b in ck.iter_blocks(ck[key], BLOCK)])


def test_offsets_from_the_listing_only_while_the_file_is_the_one_listed(tmp_path):
    """Blocks are read at the offsets found when listing; a file replaced after listing (same
    names, other layout) is opened and checked again through HDF5, never read at stale offsets."""
    path = tmp_path / "model.weights.h5"
    values = _write(path)
    other = tmp_path / "other.h5"
    moved = {k: (v[::-1].copy() if v.dtype.kind != "b" else ~v) for k, v in values.items()}
    with h5py.File(other, "w") as f:
        f.create_dataset("padding", data=np.zeros(4096, np.float64))  # every dataset lies elsewhere now
        for key, value in moved.items():
            f.create_dataset(key, data=value)
    with ckptinspect.open(str(path)) as ck:
        for key, value in values.items():
            np.testing.assert_array_equal(_blocks(ck, key), value.reshape(-1))
    with ckptinspect.open(str(path)) as ck:
        other.replace(path)  # after listing, before any value is read
        for key, value in moved.items():
            np.testing.assert_array_equal(_blocks(ck, key), value.reshape(-1))
