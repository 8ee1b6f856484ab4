"""The one place that imports TensorFlow for reading values.

TensorFlow's C++ logging is quietened before the import, and its errors are turned into
ckptinspect's own, naming the file.
"""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

from .errors import CheckpointNotFoundError, CorruptCheckpointError


@contextlib.contextmanager
def silenced_stderr():
    """Send file descriptor 2 to /dev/null: TensorFlow's C++ start-up lines bypass Python."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tf():
    """Import TensorFlow with its chatter silenced (set CKPTINSPECT_TF_LOGS=1 to see it): the
    start-up lines, and the C++ log lines it prints later (``failed call to cuInit`` on a
    machine without a GPU); its errors reach us as Python exceptions, turned into ours."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    if not os.environ.get("CKPTINSPECT_TF_LOGS"):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if os.environ.get("CKPTINSPECT_TF_LOGS"):
        import tensorflow as tf  # noqa: PLC0415
    else:
        with silenced_stderr():
            import tensorflow as tf  # noqa: PLC0415
    return tf


def load_checkpoint(prefix: str):
    """A ``CheckpointReader`` for exactly this prefix or V1 file.

    ``tf.train.load_checkpoint`` resolves a directory argument through its state file, so a
    prefix whose basename is empty (``dir/``, as ``saver.save(sess, "dir/")`` writes) would
    silently open another checkpoint; such prefixes go straight to the reader.
    """
    tf = import_tf()
    try:
        if os.path.basename(prefix) == "" or tf.io.gfile.isdir(prefix):
            from tensorflow.python.training import py_checkpoint_reader  # noqa: PLC0415

            return py_checkpoint_reader.NewCheckpointReader(prefix)
        return tf.train.load_checkpoint(prefix)
    except tf.errors.NotFoundError as e:
        raise CheckpointNotFoundError(f"{prefix}: {_first_line(e)}") from None
    except (tf.errors.OpError, ValueError) as e:
        raise CorruptCheckpointError(f"{prefix}: TensorFlow cannot open it: {_first_line(e)}") from None


def get_tensor(reader, prefix: str, key: str) -> np.ndarray:
    """One tensor's value, with TensorFlow's errors turned into ours."""
    tf = import_tf()
    try:
        # The exact bytes: a key that is not UTF-8 is held as surrogate escapes (formats._bundle_index).
        value = reader.get_tensor(key.encode("utf-8", "surrogateescape"))
    except tf.errors.NotFoundError as e:
        raise CheckpointNotFoundError(f"{prefix}: {key!r}: {_first_line(e)}") from None
    except IndexError as e:  # TF's reader raises IndexError("Read less bytes than requested")
        raise CorruptCheckpointError(
            f"{prefix}: cannot read {key!r}: {_first_line(e)} (a data shard is shorter than the index"
            " says; `ckptinspect verify` names it)"
        ) from None
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
        raise CorruptCheckpointError(f"{prefix}: cannot read {key!r}: {_first_line(e)}") from None
    if isinstance(value, bytes):
        # A scalar string: an object array keeps trailing NUL bytes, which numpy's fixed-width
        # bytes dtype would drop (serialized protos such as object graphs end in them).
        out = np.empty((), dtype=object)
        out[()] = value
        return out
    return np.asarray(value)


def _first_line(e: BaseException) -> str:
    text = getattr(e, "message", None) or str(e)
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__
