"""The one vocabulary of output kinds: what ``extract --to`` names, what a suffix of ``-o OUT``
means, and which format the file written is (a name of the format registry). ``extract``,
``rewrite``, ``average``, ``transplant`` and ``doctor --emit weights`` decide an output's kind
here, once; each command then says which kinds it writes."""

from __future__ import annotations

import os

from .. import model as m
from ..errors import UsageError

__all__ = [
    "TO_TF",
    "TO_WEIGHTS_H5",
    "TO_H5",
    "TO_NPZ",
    "TO_SAFETENSORS",
    "TO_KERAS",
    "OUTPUT_KINDS",
    "FORMAT_OF",
    "SUFFIXES",
    "output_kind",
]

TO_TF = "tf"  # a TF bundle prefix (no suffix, .ckpt or .ckpt-N)
TO_WEIGHTS_H5 = "weights-h5"
TO_H5 = "h5"  # a legacy Keras HDF5 file
TO_NPZ = "npz"
TO_SAFETENSORS = "safetensors"
TO_KERAS = "keras"  # a .keras archive (written through a model)
OUTPUT_KINDS = (TO_TF, TO_WEIGHTS_H5, TO_H5, TO_NPZ, TO_SAFETENSORS, TO_KERAS)
# Suffixes, in the order they are tried (.weights.h5 before .h5).
SUFFIXES = (
    (TO_WEIGHTS_H5, (".weights.h5",)),
    (TO_NPZ, (".npz",)),
    (TO_SAFETENSORS, (".safetensors",)),
    (TO_H5, (".h5", ".hdf5")),
    (TO_KERAS, (".keras",)),
)
# The registry's format name of what each kind writes.
FORMAT_OF = {
    TO_TF: m.FORMAT_TF_BUNDLE,
    TO_WEIGHTS_H5: m.FORMAT_KERAS_WEIGHTS_H5,
    TO_H5: m.FORMAT_KERAS_H5,
    TO_NPZ: m.FORMAT_NPZ,
    TO_SAFETENSORS: m.FORMAT_SAFETENSORS,
    TO_KERAS: m.FORMAT_KERAS_ZIP,
}


def output_kind(out: str, to: str | None = None) -> str | None:
    """The kind of output ``out`` is: ``to`` when given, else its suffix's kind.

    Args:
        out: The output path.
        to: A kind the user named (``--to``), or None.

    Returns:
        One of :data:`OUTPUT_KINDS`, or None for a name with none of :data:`SUFFIXES` (a TF
        prefix candidate: each command judges it with ``_atomic.prefix_suffix_error``).

    Raises:
        UsageError: ``to`` names no kind.
    """
    if to is not None:
        kind = to.lower()
        if kind not in OUTPUT_KINDS:
            raise UsageError(f"unknown output format {to!r}; expected one of {', '.join(OUTPUT_KINDS)}")
        return kind
    name = os.path.basename(out).lower()
    for kind, suffixes in SUFFIXES:
        if name.endswith(suffixes):
            return kind
    return None
