"""The columns readers (a giant ``.safetensors`` header, a giant TF index) switched on or off in
a test, so the former path's result can be compared with the columns'."""

from __future__ import annotations

from typing import Any, Callable

from ckptinspect.formats import _bulk

NEVER = 1 << 62


def use_columns(monkeypatch: Any, module: Any, on: bool) -> None:
    """Columns for every file (``on``) or for none: ``module`` holds the reader's
    ``COMPACT_MIN_BYTES``; the listing's ``COMPACT_MIN_VARIABLES`` follows."""
    monkeypatch.setattr(module, "COMPACT_MIN_BYTES", 0 if on else NEVER)
    monkeypatch.setattr(_bulk, "COMPACT_MIN_VARIABLES", 0 if on else NEVER)


def both_paths(monkeypatch: Any, module: Any, fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn()`` on the former path, then on the columns."""
    use_columns(monkeypatch, module, False)
    before = fn()
    use_columns(monkeypatch, module, True)
    return before, fn()
