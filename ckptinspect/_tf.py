"""The one place that imports TensorFlow (``transplant``, ``train``, ``--builder`` models,
writing through TensorFlow): an optional dependency, the ``[tf]`` extra.

Reading checkpoints never needs it (TF bundles are decoded by ``formats.tf``). Without it,
:func:`require_tf` and :func:`import_tf` raise one :class:`~.errors.MissingDependencyError`
naming ``pip install 'ckptinspect[tf]'``. TensorFlow's C++ logging is quietened before the
import.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

from .errors import MissingDependencyError

TF_EXTRA = "pip install 'ckptinspect[tf]'"


def tensorflow_available() -> bool:
    """Whether TensorFlow can be imported here (without importing it)."""
    if sys.modules.get("tensorflow") is not None:
        return True
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        return False


def require_tf(what: str) -> None:
    """Refuse, before any work, what needs TensorFlow where it is not installed.

    Args:
        what: What needs it, as the message names it (``transplant``, ``--builder models``).

    Raises:
        MissingDependencyError: ``WHAT needs TensorFlow, which is not installed: pip install 'ckptinspect[tf]'``.
    """
    if not tensorflow_available():
        raise MissingDependencyError(f"{what} needs TensorFlow, which is not installed: {TF_EXTRA}")


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


def optional_tf():
    """TensorFlow (imported quietly) where it is installed, else None: for what works with
    any Keras 3 backend and uses TensorFlow only when the model is TensorFlow's (object-graph
    paths, strategies)."""
    return import_tf() if tensorflow_available() else None


def missing_tensorflow(e: BaseException, what: str) -> MissingDependencyError | None:
    """The error to raise instead of ``e`` when ``e`` is the import of TensorFlow failing (a
    ``--builder`` module or its Keras backend importing it), else None."""
    if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "tensorflow":
        return MissingDependencyError(f"{what} needs TensorFlow, which is not installed: {TF_EXTRA}")
    return None


def import_tf(what: str = "this operation"):
    """Import TensorFlow with its chatter silenced (set CKPTINSPECT_TF_LOGS=1 to see it): the
    start-up lines, and the C++ log lines it prints later (``failed call to cuInit`` on a
    machine without a GPU); its errors reach us as Python exceptions, turned into ours."""
    if sys.modules.get("tensorflow") is not None:
        return sys.modules["tensorflow"]
    require_tf(what)
    if not os.environ.get("CKPTINSPECT_TF_LOGS"):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if os.environ.get("CKPTINSPECT_TF_LOGS"):
        import tensorflow as tf  # noqa: PLC0415
    else:
        with silenced_stderr():
            import tensorflow as tf  # noqa: PLC0415
    return tf
