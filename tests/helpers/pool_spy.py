"""A spy on the thread pools started (``_parallel.ordered_map`` imports ``ThreadPoolExecutor``
from ``concurrent.futures`` when it starts one): the real pool, recorded."""

from __future__ import annotations

import concurrent.futures
from typing import Any


def count_pools(monkeypatch: Any) -> list[tuple]:
    """Record every ``ThreadPoolExecutor`` started from now on (its positional arguments) in
    the list returned; the pools are real and work as usual."""
    started: list[tuple] = []
    real = concurrent.futures.ThreadPoolExecutor

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any):
            started.append(a)
            super().__init__(*a, **kw)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", Counting)
    return started
