"""Layout rules: how a source value's shape may differ from the model variable it goes into.

By default a source value fits a model variable only when the two shapes are equal. A user who
knows the source comes from another framework names the rules that hold (``doctor`` and
``transplant`` options); the matcher compares shapes through them and the value is rearranged
the same way when it is assigned or written:

* ``transpose_dense`` (``--transpose-dense``): a 2-D kernel is stored ``[out, in]`` (PyTorch
  ``Linear.weight``) where Keras has ``[in, out]``: transposed.
* ``conv_layout="oihw"`` (``--conv-layout oihw``): convolution kernels are stored
  ``[out, in, *spatial]`` (PyTorch ``Conv{1,2,3}d.weight``, OIHW) where Keras has
  ``[*spatial, in, out]`` (HWIO): axes reordered.
* ``allow_reshape`` (``--allow-reshape``): any two shapes with the same number of elements
  fit; the value is reshaped (C order). Used last, when no rule above applies.

The transposition rules apply only to a model variable whose leaf name is a kernel (``kernel``,
``recurrent_kernel``, ...): an ``Embedding``'s ``[vocabulary, dim]`` table or a norm's ``gamma``
keeps its layout. Pure functions of shapes and names; numpy is imported only to rearrange a value.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

__all__ = [
    "CONV_HWIO",
    "CONV_OIHW",
    "CONV_LAYOUTS",
    "FIT_EQUAL",
    "FIT_TRANSPOSE",
    "FIT_PERMUTE",
    "FIT_RESHAPE",
    "Layout",
    "Fit",
    "fit",
    "apply_fit",
    "target_shape_of",
]

CONV_HWIO = "hwio"
CONV_OIHW = "oihw"
CONV_LAYOUTS = (CONV_HWIO, CONV_OIHW)

FIT_EQUAL = "equal"
FIT_TRANSPOSE = "transpose"
FIT_PERMUTE = "permute"
FIT_RESHAPE = "reshape"

# A model variable whose leaf name contains this is a kernel (dense, conv, recurrent, depthwise).
KERNEL_MARK = "kernel"
# Ranks of convolution kernels (Conv1D, Conv2D, Conv3D).
CONV_RANKS = (3, 4, 5)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The layout rules a user named (all off by default: shapes must be equal).

    Attributes:
        transpose_dense: Source 2-D kernels are ``[out, in]``.
        conv_layout: ``hwio`` (Keras, the default) or ``oihw`` (PyTorch) for source conv kernels.
        allow_reshape: Shapes with the same number of elements fit (the value is reshaped).
    """

    transpose_dense: bool = False
    conv_layout: str = CONV_HWIO
    allow_reshape: bool = False

    def __post_init__(self) -> None:
        if self.conv_layout not in CONV_LAYOUTS:
            from ...errors import UsageError  # noqa: PLC0415 - errors only on a bad value

            raise UsageError(f"conv layout must be one of {', '.join(CONV_LAYOUTS)}. Received: {self.conv_layout!r}")

    @property
    def plain(self) -> bool:
        """No rule: shapes must be equal."""
        return not (self.transpose_dense or self.conv_layout != CONV_HWIO or self.allow_reshape)

    def describe(self) -> tuple[str, ...]:
        """The rules in force, as the options that name them."""
        out = []
        if self.transpose_dense:
            out.append("--transpose-dense")
        if self.conv_layout != CONV_HWIO:
            out.append(f"--conv-layout {self.conv_layout}")
        if self.allow_reshape:
            out.append("--allow-reshape")
        return tuple(out)


PLAIN = Layout()


@dataclasses.dataclass(frozen=True)
class Fit:
    """How a source value goes into a model variable.

    Attributes:
        kind: ``equal``, ``transpose``, ``permute`` or ``reshape``.
        axes: For ``transpose``/``permute``: the axes of the source, in the model's order.
        shape: The model variable's shape.
    """

    kind: str
    axes: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()

    @property
    def identity(self) -> bool:
        return self.kind == FIT_EQUAL

    def describe(self) -> str:
        if self.kind == FIT_EQUAL:
            return "equal"
        if self.kind == FIT_RESHAPE:
            return f"reshaped to [{','.join(map(str, self.shape))}]"
        return f"{self.kind}d (axes {','.join(map(str, self.axes))})"


def _permuted(shape: Sequence[int], axes: Sequence[int]) -> tuple[int, ...]:
    return tuple(shape[i] for i in axes)


def _conv_axes(rank: int) -> tuple[int, ...]:
    """OIHW -> HWIO for a kernel of ``rank``: ``(O, I, *spatial)`` -> ``(*spatial, I, O)``."""
    return (*range(2, rank), 1, 0)


def fit(source_shape: Sequence[int], target_shape: Sequence[int], target_leaf: str = "", layout: Layout = PLAIN) -> Fit | None:
    """How a source value of ``source_shape`` goes into a model variable, or None if it cannot.

    Args:
        source_shape: The source variable's shape.
        target_shape: The model variable's shape.
        target_leaf: The model variable's leaf name (``kernel``, ``bias``...): the transposition
            rules apply to kernels only.
        layout: The rules in force.

    Returns:
        A :class:`Fit`, or None.
    """
    src, dst = tuple(source_shape), tuple(target_shape)
    kernel = KERNEL_MARK in target_leaf
    if kernel and layout.transpose_dense and len(src) == 2 and len(dst) == 2:
        if (src[1], src[0]) == dst:
            return Fit(FIT_TRANSPOSE, (1, 0), dst)
        return None
    if kernel and layout.conv_layout == CONV_OIHW and len(src) in CONV_RANKS and len(src) == len(dst):
        axes = _conv_axes(len(src))
        if _permuted(src, axes) == dst:
            return Fit(FIT_PERMUTE, axes, dst)
        return None
    if src == dst:
        return Fit(FIT_EQUAL, (), dst)
    if layout.allow_reshape and math.prod(src) == math.prod(dst):
        return Fit(FIT_RESHAPE, (), dst)
    return None


def target_shape_of(source_shape: Sequence[int], f: Fit) -> tuple[int, ...]:
    """The shape a value of ``source_shape`` has once ``f`` is applied."""
    if f.kind in (FIT_TRANSPOSE, FIT_PERMUTE):
        return _permuted(source_shape, f.axes)
    if f.kind == FIT_RESHAPE:
        return f.shape
    return tuple(source_shape)


def apply_fit(value: Any, f: Fit | None) -> Any:
    """``value`` (a numpy array) rearranged by ``f`` (a contiguous copy unless ``f`` is equal)."""
    if f is None or f.kind == FIT_EQUAL:
        return value
    import numpy as np  # noqa: PLC0415 - only when a value is rearranged

    if f.kind == FIT_RESHAPE:
        return np.ascontiguousarray(value).reshape(f.shape)
    return np.ascontiguousarray(np.transpose(value, f.axes))
