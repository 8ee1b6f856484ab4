"""How close scan's figures must be to numpy's float64 arithmetic (issue 28's decision).

float32 values are reduced in float32 through BLAS, merged in float64 per piece: agreement with
float64 to 1e-6 relative; a cosine (whose scale is 1) to 1e-6 absolute.
"""

from __future__ import annotations

import pytest

SCAN_REL = 1e-6


def scan_close(key: str, expected: float):
    """``pytest.approx`` of one figure (``norm``, ``max_abs_change``, ``rel_change``, ``cosine``)."""
    if key == "cosine":
        return pytest.approx(expected, rel=SCAN_REL, abs=SCAN_REL)
    return pytest.approx(expected, rel=SCAN_REL, abs=1e-15)
