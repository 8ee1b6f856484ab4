"""``--builder pkg.module:function``: the user's function that builds a model, shared by the
operations that need a live model (``transplant``, ``extract`` to ``.weights.h5``)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from ...errors import UsageError

__all__ = ["load_builder"]


def load_builder(spec: str) -> Callable[[], Any]:
    """Import ``pkg.module:function`` and return the function.

    The current directory is importable, as for ``python -m``, and stays so: a builder may
    import its own helpers when it is called.

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
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any failure to import is the user's builder
        raise UsageError(f"--builder {spec}: cannot import {module_name!r}: {type(e).__name__}: {e}") from None
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise UsageError(f"--builder {spec}: {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise UsageError(f"--builder {spec}: {attr!r} is not callable")
    return fn
