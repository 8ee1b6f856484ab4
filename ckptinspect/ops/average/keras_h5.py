"""``average`` of Keras HDF5 files of one run (e.g. ``keras.callbacks.ModelCheckpoint``): Keras 3
``.weights.h5`` files into a ``.weights.h5``, legacy ``.h5`` files (``tf_keras`` or Keras 3's legacy
writer; full models or weights only) into a ``.h5``.

The newest file is copied as it is (groups, attributes, layout), then every averaged dataset is
overwritten in place, in row blocks, with the values computed as for TF bundles
(:mod:`.arithmetic`); the others keep the newest's bytes. The file is written by the Keras
family (``formats.update_h5_copy``); this module decides what goes in it. Read back before the rename: the
keys, shapes and dtypes of the newest, each averaged dataset's values (crc32c) as computed and
each other dataset as the newest's.
"""

from __future__ import annotations

import os
from typing import Iterator, Sequence

import numpy as np

from ... import _atomic
from ... import model as m
from ...errors import UsageError, VerificationError
from .arithmetic import BLOCK_ELEMENTS, Combiner, Computed, averaged_dtype, lockstep
from .report import ACTION_AVERAGED, ACTION_COPIED, AveragedVariable

__all__ = ["WEIGHTS_H5_SUFFIX", "average_weights_h5"]

WEIGHTS_H5_SUFFIX = ".weights.h5"
CHECK_ELEMENTS = 1 << 20


def _crc_of(ckpt: m.Checkpoint, var: m.Variable) -> int:
    record = Computed()
    for block in ckpt.iter_blocks(var, CHECK_ELEMENTS):
        record.add(np.ascontiguousarray(block))
    return record.crc32c


def _combined(ckpts: Sequence[m.Checkpoint], v: m.Variable, combiner: Combiner, elements: int,
              record: Computed) -> Iterator[np.ndarray]:
    """The averaged value of ``v`` in blocks of ``elements``, each added to ``record``."""
    dtype = m.numpy_dtype(v.dtype)
    for blocks in lockstep([c.iter_blocks(c[v.key], elements) for c in ckpts], f"'{m.display_name(v.key)}'"):
        result = combiner.combine(blocks, dtype, v.size)
        record.add(result)
        yield result


def average_weights_h5(ckpts: Sequence[m.Checkpoint], out: str, decay: float | None, role: str | None, force: bool,
                       protected: Sequence[str], progress) -> tuple[list[AveragedVariable], int, int]:
    """Write the average of ``ckpts`` (oldest first) to ``out``.

    Returns:
        (every variable of the newest with its action, tensors checked, bytes written).

    Raises:
        UsageError: ``role`` given (not supported for Keras HDF5 outputs).
        VerificationError: The output did not read back as computed.
    """
    from ...formats import open_checkpoint, row_block_elements, update_h5_copy  # noqa: PLC0415 - h5py for Keras files only

    if role is not None:
        raise UsageError("average --role model writes TF checkpoints only; for Keras HDF5 inputs, average them all "
                         "and drop the optimizer with `ckptinspect extract OUT -o MODEL.weights.h5` (or MODEL.h5)")
    newest = ckpts[-1]
    combiner = Combiner(len(ckpts), decay)
    planned = [AveragedVariable(v.name, v.key, v.key, v.role, v.shape, v.dtype, v.nbytes,
                                ACTION_AVERAGED if averaged_dtype(v) else ACTION_COPIED) for v in newest.variables]
    averaged = [newest[p.key] for p in planned if p.action == ACTION_AVERAGED]
    computed: dict[str, int] = {}
    with _atomic.atomic_file(out, force=force, kind=_atomic.KIND_HDF5, protected=protected) as tmp:
        with update_h5_copy(newest.path, tmp) as f:
            for done, v in enumerate(averaged, 1):
                record = Computed()
                elements = row_block_elements(v.shape, BLOCK_ELEMENTS)  # whole rows per block
                f.write_blocks(v.key, v.shape, _combined(ckpts, v, combiner, elements, record))
                computed[v.key] = record.crc32c
                if progress is not None:
                    progress(done, len(averaged), v)
        checked = 0
        with open_checkpoint(tmp) as written:
            by_key = {v.key: v for v in written.variables}
            if set(by_key) != {p.key for p in planned}:
                raise VerificationError(f"{out}: read-back check failed: the datasets are not the newest's")
            for p in planned:
                w = by_key[p.key]
                if (w.shape, w.dtype) != (p.shape, p.dtype):
                    raise VerificationError(f"{out}: read-back check failed: '{m.display_name(p.key)}' changed shape or dtype")
                want = computed[p.key] if p.action == ACTION_AVERAGED else _crc_of(newest, newest[p.key])
                if _crc_of(written, w) != want:
                    raise VerificationError(f"{out}: read-back check failed: '{m.display_name(p.key)}' does not hold "
                                            + ("the values computed" if p.action == ACTION_AVERAGED else "the newest's values"))
                checked += 1
        size = os.path.getsize(tmp)
    return planned, checked, size
