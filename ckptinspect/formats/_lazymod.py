"""Modules loaded on first use, so that a command that never needs them does not pay for them.

``ls`` of a ``.safetensors`` or ``.pt`` file reaches the TF bundle reader's module (the format
registry imports it) but never decodes a protobuf: the protobuf runtime and the descriptors
built in :mod:`._protos` (about a third of the package's own import time) load when a TF
index or object graph is first parsed. Uses the standard library's
:class:`importlib.util.LazyLoader`.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

__all__ = ["lazy_import"]


def lazy_import(name: str) -> ModuleType:
    """The module ``name``, executed when one of its attributes is first read.

    Args:
        name: The absolute module name.

    Returns:
        The module (the real one if it is already imported).
    """
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:  # pragma: no cover - a module of this package
        raise ImportError(f"no module named {name!r}")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
