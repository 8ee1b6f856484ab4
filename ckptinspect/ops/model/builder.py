"""``--builder pkg.module:function``: the user's function that builds a model, shared by the
operations that need a live model (``transplant``, ``extract`` to ``.weights.h5``)."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any, Callable

from ..._tf import missing_tensorflow
from ...errors import UsageError

__all__ = ["load_builder"]


def load_builder(spec: str) -> Callable[[], Any]:
    """Import ``pkg.module:function`` and return the function.

    The current directory is importable, as for ``python -m``, and stays so: a builder may
    import its own helpers when it is called. What the module prints while it is imported, and
    the function while it runs (``model.summary()``...), goes to stderr: stdout is the
    command's report (``--format json`` must stay one document).

    Raises:
        UsageError: Not ``module:function``, the module does not import, or no such callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--builder must be pkg.module:function. Received: {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        with _prints_to_stderr():
            module = importlib.import_module(module_name)
    except SystemExit as e:
        raise UsageError(f"--builder {spec}: importing {module_name!r} {_exit_text(e)}") from None
    except Exception as e:  # noqa: BLE001 - any failure to import is the user's builder
        missing = missing_tensorflow(e, f"--builder {spec}")
        if missing is not None:  # the module (or its Keras backend) imports TensorFlow
            raise missing from None
        raise UsageError(f"--builder {spec}: cannot import {module_name!r}: {type(e).__name__}: {e}") from None
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise UsageError(f"--builder {spec}: {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise UsageError(f"--builder {spec}: {attr!r} is not callable")
    return _no_exit(spec, fn)


def _prints_to_stderr() -> contextlib.AbstractContextManager:
    """``print`` (``sys.stdout``) goes to ``sys.stderr`` inside the block."""
    return contextlib.redirect_stdout(sys.stderr)


def _exit_text(e: SystemExit) -> str:
    return (f"exited (SystemExit({e.code!r:.40}): sys.exit, absl.app.run...) instead of returning a model;"
            " a builder must return the model")


def _no_exit(spec: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` whose ``SystemExit`` (``sys.exit``, ``absl.app.run``) is an error naming the builder,
    not the command's own exit (code 0 with no output, or an unexplained code)."""

    def builder(*args: Any, **kwargs: Any) -> Any:
        try:
            with _prints_to_stderr():
                return fn(*args, **kwargs)
        except SystemExit as e:
            raise UsageError(f"--builder {spec}: {_exit_text(e)}") from None

    builder.__name__ = getattr(fn, "__name__", "builder")
    builder.__wrapped__ = fn  # type: ignore[attr-defined]
    builder.spec = spec  # type: ignore[attr-defined] - how errors name it (--builder SPEC)
    return builder
