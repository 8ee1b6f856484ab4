"""The one vocabulary of output kinds (formats.output_kind): every writing command decides an
output's kind through it."""

from __future__ import annotations

import pytest

from ckptinspect import formats
from ckptinspect.errors import UsageError
from ckptinspect.ops.extract.operation import output_format_for
from ckptinspect.ops.model.weights_io import output_kind as transplant_output_kind


@pytest.mark.parametrize("out,kind", [
    ("x/model.weights.h5", "weights-h5"), ("M.WEIGHTS.H5", "weights-h5"), ("a.npz", "npz"),
    ("a.safetensors", "safetensors"), ("a.h5", "h5"), ("a.hdf5", "h5"), ("a.keras", "keras"),
    ("out/ckpt-5", None), ("model.ckpt", None),
])
def test_suffixes(out, kind):
    assert formats.output_kind(out) == kind


def test_to_names_the_kind_and_is_checked():
    assert formats.output_kind("anything.bin", "NPZ") == "npz"
    with pytest.raises(UsageError, match="unknown output format 'pt'; expected one of tf, weights-h5, h5, npz"):
        formats.output_kind("a.pt", "pt")


def test_each_kind_writes_a_registered_format():
    assert set(formats.FORMAT_OF) == set(formats.OUTPUT_KINDS)
    assert set(formats.FORMAT_OF.values()) <= set(formats.FORMATS)


def test_commands_take_their_kinds_from_it():
    assert output_format_for("a.weights.h5") == formats.TO_WEIGHTS_H5
    assert output_format_for("out/ckpt-5") == formats.TO_TF
    with pytest.raises(UsageError, match="does not write .keras"):
        output_format_for("a.keras")
    assert transplant_output_kind("m.keras") == formats.TO_KERAS
    assert transplant_output_kind("out/net") == formats.TO_TF
    with pytest.raises(UsageError, match="legacy .h5 output is not written"):
        transplant_output_kind("m.h5")
