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
