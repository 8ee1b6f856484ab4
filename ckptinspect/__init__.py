"""ckptinspect: inspect, compare and operate on TensorFlow and Keras checkpoints.

>>> import ckptinspect
>>> ckpt = ckptinspect.open("runs/ckpts")          # any supported format
>>> [v.name for v in ckpt.filter(role="model")]
>>> ckpt.read("encoder/enc_dense/kernel")           # one numpy array

Importing this package does not import TensorFlow; only reading values of TF checkpoints
(and commands that need a model) does.
"""

from __future__ import annotations

from .errors import (
    CheckpointNotFoundError,
    CkptError,
    CorruptCheckpointError,
    NotACheckpointError,
    OutputExistsError,
    TransplantError,
    UnsafeFileError,
    UsageError,
)
from .model import ROLES, Checkpoint, RetainedCheckpoint, SliceInfo, Variable

__version__ = "0.1.0"

__all__ = [
    "open",
    "diff",
    "verify",
    "extract",
    "transplant",
    "Checkpoint",
    "Variable",
    "SliceInfo",
    "RetainedCheckpoint",
    "ROLES",
    "CkptError",
    "CheckpointNotFoundError",
    "NotACheckpointError",
    "CorruptCheckpointError",
    "UnsafeFileError",
    "OutputExistsError",
    "UsageError",
    "TransplantError",
]


def open(path: str) -> Checkpoint:  # noqa: A001 - the natural name, as h5py.File / safe_open
    """Open a checkpoint of any supported format.

    Args:
        path: A TF checkpoint prefix or ``.index`` file, a checkpoint or SavedModel
            directory, or a Keras ``.h5`` / ``.weights.h5`` / ``.keras`` file.

    Returns:
        The :class:`Checkpoint`: metadata now, values on ``read()``.

    Raises:
        CkptError: A subclass naming the file and the problem.
    """
    from .formats import open_checkpoint  # noqa: PLC0415

    return open_checkpoint(path)


def diff(a, b, *, atol=0.0, rtol=0.0, role=None, mapping=None, progress=None):
    """Compare two checkpoints, of the same or of different formats, one tensor pair at a time.

    Args:
        a: Checkpoint A: any path :func:`open` accepts, or an open :class:`Checkpoint`.
        b: Checkpoint B, likewise.
        atol: Absolute tolerance (numpy ``isclose`` semantics, NaN equal to NaN; 0 = exact).
        rtol: Relative tolerance, of B's magnitude (0 = exact).
        role: Compare only ``model``, ``optimizer`` or ``metadata`` variables.
        mapping: ``"REGEX=REPLACEMENT"`` rules (or a dict) rewriting A's names before aligning.
        progress: Optional ``progress(done, total, item)`` callback, once per variable.

    Returns:
        A :class:`ckptinspect.ops.diff.DiffReport` (``.identical``, ``.variables``,
        ``.layers``, ``.verdict``, ``.to_dict()``).

    Raises:
        UsageError: Bad tolerance, role or mapping.
        CkptError: A checkpoint cannot be opened or read.
    """
    from .ops.diff import diff as _diff  # noqa: PLC0415

    return _diff(a, b, atol=atol, rtol=rtol, role=role, mapping=mapping, progress=progress)


def extract(src, out, *, format=None, force=False, keep=("model",), builder=None, max_shard_bytes=None,  # noqa: A002
            progress=None):
    """Write the model's weights of a checkpoint alone, optimizer state stripped, still restorable.

    Args:
        src: Any path :func:`open` accepts.
        out: A TF prefix, or a ``.weights.h5`` / ``.h5`` / ``.npz`` file (the format follows the
            suffix unless ``format`` is ``tf``, ``weights-h5``, ``h5`` or ``npz``).
        format: The output format, overriding the suffix.
        force: Replace an existing output (the source is never overwritten).
        keep: Roles to keep: ``("model",)`` or ``("model", "metadata")``.
        builder: ``.weights.h5`` from a TF2 checkpoint: a function (or ``"module:function"``)
            returning the built Keras 3 model.
        max_shard_bytes: TF output: bytes per data shard, bounding memory (default: the largest
            kept tensor, at least 64 MiB).
        progress: Optional ``progress(done, total, variable)`` callback, once per kept tensor.

    Returns:
        A :class:`ckptinspect.ops.extract.ExtractReport` (``.kept``, ``.dropped``, ``.saving``,
        ``.to_dict()``).

    Raises:
        CkptError: A subclass naming the file and the problem (``OutputExistsError`` without
            ``force``, ``UsageError`` for a format that does not fit the source).
    """
    from .ops.extract import extract as _extract  # noqa: PLC0415

    return _extract(src, out, format=format, force=force, keep=keep, builder=builder,
                    max_shard_bytes=max_shard_bytes, progress=progress)


def verify(path: str, progress=None):
    """Check that a checkpoint (or every checkpoint of a directory) is whole.

    TF bundles: the index parses, every shard exists and is long enough, every tensor's
    stored crc32c matches its bytes (streamed, no TensorFlow). Keras files: the file opens
    and every dataset reads.

    Args:
        path: Any path :func:`open` accepts.
        progress: Optional ``progress(done, total, item)`` callback, once per tensor.

    Returns:
        A :class:`ckptinspect.ops.verify.VerifyReport` (``.intact``, ``.damaged``,
        ``.newest_intact``, ``.to_dict()``). Damage is reported, not raised.

    Raises:
        CkptError: The path is missing, not a checkpoint, or unsafe to read.
    """
    from .ops.verify import verify as _verify  # noqa: PLC0415

    return _verify(path, progress=progress)


def transplant(source, model, *, mapping=None, strategy=None, strict=True, skip_mismatch=False,
               dry_run=False, by_order=False):
    """Put a checkpoint's model weights into a built model, inside the model's tf.distribute strategy.

    Pairs variables by object-graph path (same architecture), then readable names, then
    ``mapping`` rules, then (``by_order=True``) order and shape; assigns in the model's
    strategy so every replica receives the value, and checks every replica afterwards.
    Optimizer state is not transplanted. Never prints.

    Args:
        source: Any path :func:`open` accepts, or an open :class:`Checkpoint`.
        model: A built Keras 3 model or a ``tf.Module`` with its variables.
        mapping: ``{regex: replacement}`` applied to source names.
        strategy: The strategy to assign in (default: the model's own).
        strict: Raise one error listing every problem (default) instead of transplanting what matches.
        skip_mismatch: With ``strict``, leave shape/dtype mismatches at init instead of failing.
        dry_run: Return the plan without assigning.
        by_order: Pair what is left by order and shape.

    Returns:
        A :class:`ckptinspect.ops.transplant.TransplantReport` (assigned, mismatches,
        left at init, unused source variables, ``.to_dict()``).

    Raises:
        UsageError: Unbuilt model, unsupported strategy (ParameterServerStrategy), bad rule.
        TransplantError: Strict problems, or a replica that
            did not receive its value.
    """
    from .ops.transplant import transplant as _transplant  # noqa: PLC0415

    return _transplant(source, model, mapping=mapping, strategy=strategy, strict=strict,
                       skip_mismatch=skip_mismatch, dry_run=dry_run, by_order=by_order)
