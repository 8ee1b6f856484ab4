"""Comparing values across frameworks: A's value rearranged into B's layout (``diff``).

``diff --transpose-dense`` / ``--conv-layout oihw`` name the same layout rules as ``doctor``
and ``transplant`` (:mod:`ckptinspect.ops.match.layouts`), with A in the role of the source: A's 2-D
kernels are ``[out, in]`` (PyTorch ``Linear``) and its conv kernels OIHW, where B (Keras) has
``[in, out]`` and HWIO. For each pair the matcher made, :func:`pair_fit` decides from the shapes
and B's leaf name (the rules apply to kernels only) whether A's value is rearranged;
:class:`RearrangedSource` then hands the comparison A's value in B's layout, so the streamed
comparison (:func:`ckptinspect.ops.diff.compare.compare_variables`) is the same code as always.

A rearranged value is read whole and copied once (a transposition is not a stream): memory is
bounded by about two tensors for those pairs, one for all others.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from .. import model as m
from .match.layouts import FIT_PERMUTE, FIT_TRANSPOSE, Fit, Layout, apply_fit, fit, target_shape_of
from .match.layers import split_name
from .match.matcher import normalize_name

__all__ = ["pair_fit", "fits_reversed", "RearrangedSource"]

# Fits diff applies: the layout rules' rearrangements (a reshape is not a diff rule).
REARRANGING = (FIT_TRANSPOSE, FIT_PERMUTE)


def pair_fit(va: m.Variable, vb: m.Variable, layout: Layout) -> Fit | None:
    """How A's value must be rearranged to compare with B's under ``layout``, or None.

    Args:
        va: A's variable (the side whose layout the rules describe).
        vb: B's variable (Keras layout; its leaf name says whether it is a kernel).
        layout: The rules in force.

    Returns:
        A transposing or permuting :class:`~ckptinspect.ops.match.layouts.Fit`, or None when the
        values compare as they are (no rule applies, or the shapes do not fit). A square kernel
        is transposed too: the rule, not the shapes, says where its axes are.
    """
    if layout.plain:
        return None
    leaf = split_name(normalize_name(vb.name))[1]
    f = fit(va.shape, vb.shape, leaf, layout)
    return f if f is not None and f.kind in REARRANGING else None


def fits_reversed(va: m.Variable, vb: m.Variable, layout: Layout) -> bool:
    """Whether B's value would fit A's under ``layout`` (the checkpoints given the other way
    round: the rules describe A), where A's does not fit B's."""
    if layout.plain or pair_fit(va, vb, layout) is not None:
        return False
    return pair_fit(vb, va, layout) is not None


class RearrangedSource:
    """A checkpoint's values as ``compare_variables`` reads them, some rearranged.

    Args:
        ckpt: The checkpoint (A).
        fits: ``key -> (original variable, fit)`` for the variables to rearrange.
    """

    def __init__(self, ckpt: m.Checkpoint, fits: dict[str, tuple[m.Variable, Fit]]):
        self._ckpt = ckpt
        self._fits = fits
        self.path = ckpt.path

    @staticmethod
    def view(va: m.Variable, f: Fit) -> m.Variable:
        """``va`` as it looks once rearranged (the shape of B)."""
        return dataclasses.replace(va, shape=target_shape_of(va.shape, f))

    def read(self, var: m.Variable) -> Any:
        entry = self._fits.get(var.key)
        if entry is None:
            return self._ckpt.read(var)
        original, f = entry
        return apply_fit(self._ckpt.read(original), f)

    def iter_blocks(self, var: m.Variable, elements: int) -> Iterator[Any]:
        entry = self._fits.get(var.key)
        if entry is None:
            yield from self._ckpt.iter_blocks(var, elements)
            return
        value = self.read(var).reshape(-1)
        step = max(1, elements)
        for i in range(0, value.size, step):
            yield value[i : i + step]
