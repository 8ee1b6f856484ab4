"""ckptinspect: inspect, compare and operate on model checkpoints (TensorFlow, Keras, PyTorch,
safetensors, npz).

>>> import ckptinspect
>>> ckpt = ckptinspect.open("runs/ckpts")          # any supported format
>>> [v.name for v in ckpt.filter(role="model")]
>>> ckpt.read("encoder/enc_dense/kernel")           # one numpy array

Importing this package does not import TensorFlow; only reading values of TF checkpoints
(and commands that need a model) does.
"""

from __future__ import annotations

import os as _os

from .errors import (
    CheckpointNotFoundError,
    CkptError,
    CorruptCheckpointError,
    NotACheckpointError,
    OutputExistsError,
    OutputWriteError,
    TransplantError,
    UnallocatedDataError,
    UnsafeFileError,
    UsageError,
    VerificationError,
)
from .model import ROLES, Checkpoint, RetainedCheckpoint, SliceInfo, Variable

__version__ = "0.1.0"

__all__ = [
    "open",
    "diff",
    "verify",
    "extract",
    "transplant",
    "doctor",
    "plan",
    "rewrite",
    "scan",
    "average",
    "mark_optimizer",
    "Checkpoint",
    "Variable",
    "SliceInfo",
    "RetainedCheckpoint",
    "ROLES",
    "CkptError",
    "CheckpointNotFoundError",
    "NotACheckpointError",
    "CorruptCheckpointError",
    "UnallocatedDataError",
    "UnsafeFileError",
    "OutputExistsError",
    "OutputWriteError",
    "UsageError",
    "TransplantError",
    "VerificationError",
]


def open(path: str | _os.PathLike[str]) -> Checkpoint:  # noqa: A001 - the natural name, as h5py.File / safe_open
    """Open a checkpoint of any supported format.

    Args:
        path: A TF checkpoint prefix or ``.index`` file, a checkpoint or SavedModel
            directory, or a Keras ``.h5`` / ``.weights.h5`` / ``.keras`` file (a ``str`` or
            an ``os.PathLike`` such as ``pathlib.Path``).

    Returns:
        The :class:`Checkpoint`: metadata now, values on ``read()``.

    Raises:
        TypeError: ``path`` is not a ``str`` or ``os.PathLike`` of one (``None``, a number,
            ``bytes``).
        CkptError: A subclass naming the file and the problem.
    """
    from .formats import open_checkpoint  # noqa: PLC0415

    fspath = _os.fspath(path) if isinstance(path, _os.PathLike) else path
    if not isinstance(fspath, str):
        raise TypeError(f"path must be a str or os.PathLike of str. Received: {type(path).__name__} {path!r:.80}")
    return open_checkpoint(fspath)


# The operations are imported on first use (``ckptinspect.diff`` imports numpy, ``transplant``
# TensorFlow when called): each name maps to the function of its module, with that function's
# own signature and docstring.
_OPERATIONS = {
    "diff": "ckptinspect.ops.diff.operation",
    "extract": "ckptinspect.ops.extract.operation",
    "verify": "ckptinspect.ops.verify",
    "transplant": "ckptinspect.ops.model.transplant",
    "doctor": "ckptinspect.ops.doctor.operation",
    "plan": "ckptinspect.ops.plan.operation",
    "rewrite": "ckptinspect.ops.rewrite.operation",
    "average": "ckptinspect.ops.average.operation",
    "mark_optimizer": "ckptinspect.ops.roles",
    "scan": "ckptinspect.ops.scan.operation",
}


def __getattr__(name: str):
    module = _OPERATIONS.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptinspect' has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_OPERATIONS))
