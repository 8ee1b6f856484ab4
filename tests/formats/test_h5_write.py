"""formats/keras/h5_write: what HDF5 outputs share."""

import h5py
import numpy as np

from ckptinspect.formats.keras.h5_write import copy_attrs


def test_copy_attrs_keeps_values_and_stored_types(tmp_path):
    with h5py.File(tmp_path / "src.h5", "w") as src, h5py.File(tmp_path / "dst.h5", "w") as dst:
        src.attrs["weight_names"] = np.array([b"dense/kernel:0", b"dense/bias:0"])  # fixed-length
        src.attrs.create("backend", "tensorflow", dtype=h5py.string_dtype())  # variable-length
        src.attrs.create("step", 7, dtype=np.int16)
        copy_attrs(src, dst)
        assert sorted(dst.attrs) == sorted(src.attrs)
        for name in src.attrs:
            assert dst.attrs.get_id(name).dtype == src.attrs.get_id(name).dtype
            assert np.array_equal(dst.attrs[name], src.attrs[name])


# -- formats/keras/write (through the door's names) --------------------------------------------
import pytest  # noqa: E402

from ckptinspect import formats  # noqa: E402
from ckptinspect.errors import UsageError  # noqa: E402


def _source(path):
    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = "3.0"
        f.create_dataset("layers/dense/vars/0", data=np.arange(6, dtype=np.float32).reshape(3, 2))
        f["layers/dense/vars"].attrs["name"] = "dense"
        f.create_dataset("optimizer/vars/0", data=np.zeros(2, dtype=np.float32))
    return path


def test_copy_h5_drops_a_group_and_applies_an_edit(tmp_path):
    src_path = _source(tmp_path / "src.weights.h5")
    edit = formats.weights_h5_renames("src", [("dense/vars/0", "layers/dense/vars/0", "head/vars/0")])
    with h5py.File(src_path, "r") as src:
        formats.copy_h5(src, str(tmp_path / "out.h5"), drop=formats.KERAS_OPTIMIZER_GROUP, edit=edit)
        with formats.read_h5_output(str(tmp_path / "out.h5")) as out:
            assert formats.KERAS_OPTIMIZER_GROUP not in out
            assert out.datasets() == ["layers/dense/vars/0"]
            assert out.differing_root_attr(src) is None
            assert np.array_equal(out.read("layers/dense/vars/0"), formats.h5_value(src, "layers/dense/vars/0"))
    with h5py.File(tmp_path / "out.h5", "r") as out:
        assert out["layers/dense/vars"].attrs["name"] == "head"


def test_weights_h5_renames_refuse_what_the_layout_cannot_hold():
    with pytest.raises(UsageError, match="layer name only"):
        formats.weights_h5_renames("src", [("dense/vars/0", "layers/dense/vars/0", "dense/vars/1")])


def test_update_h5_copy_writes_whole_row_blocks(tmp_path):
    src_path = _source(tmp_path / "src.weights.h5")
    elements = formats.row_block_elements((3, 2), 3)
    assert elements == 2  # one whole row of 2
    values = np.arange(100, 106, dtype=np.float32)
    with formats.update_h5_copy(str(src_path), str(tmp_path / "avg.h5")) as f:
        f.write_blocks("layers/dense/vars/0", (3, 2), (values[i : i + elements] for i in range(0, 6, elements)))
    with h5py.File(tmp_path / "avg.h5", "r") as out:
        assert np.array_equal(out["layers/dense/vars/0"][()], values.reshape(3, 2))
        assert np.array_equal(out["optimizer/vars/0"][()], np.zeros(2))


def test_npz_writer_round_trip_and_refusals(tmp_path):
    assert formats.npy_array(np.zeros(2, dtype=[("a", "i4")])) is None
    assert formats.npy_array(np.array(["x"], dtype=object)).dtype.kind == "S"
    with formats.write_npz(str(tmp_path / "o.npz")) as npz:
        npz.add("a/b", formats.npy_array(np.arange(3)))
    with formats.read_npz(str(tmp_path / "o.npz")) as npz:
        assert npz.files == ["a/b"] and np.array_equal(npz["a/b"], np.arange(3))
