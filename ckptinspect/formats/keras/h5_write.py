"""Writing HDF5 files as Keras reads them: what every HDF5 output (``extract``, ``rewrite``,
``average``) does the same way."""

from __future__ import annotations

from typing import Any

__all__ = ["copy_attrs"]


def copy_attrs(src: Any, dst: Any) -> None:
    """Copy every attribute of the h5py object ``src`` (a file, group or dataset) onto ``dst``
    with the HDF5 type it is stored with (fixed- or variable-length strings, integer widths as
    written), which ``dst.attrs[name] = value`` would choose afresh from the numpy value."""
    for name in src.attrs:
        dst.attrs.create(name, src.attrs[name], dtype=src.attrs.get_id(name).dtype)
