"""The only formatting code: reports to tables, JSON and CSV, for people and for scripts.

The library never prints; the CLI hands each command's report to its view here:

* :mod:`._core`: the shared machinery: :func:`render` (rows to table / JSON / CSV), safe
  display of names other people wrote (control characters escaped, CSV formula guards),
  fitting tables to the terminal, sizes, shapes, numbers, the progress line;
* :mod:`.inspection`: ``ls``, ``verify``, ``diff``;
* :mod:`.surgery`: ``extract``, ``rewrite``, ``average``, ``transplant``, ``doctor``;
* :mod:`.scan`: ``scan`` (and its ``--plot`` PNG; matplotlib only when asked for);
* :mod:`.plan`: ``plan``.

Rendering imports nothing of the package but the model (an import-linter contract).
"""

from __future__ import annotations

from . import _core, inspection, plan, scan, surgery
from ._core import *  # noqa: F403 - each module's public names are the package's
from .inspection import *  # noqa: F403
from .plan import *  # noqa: F403
from .scan import *  # noqa: F403
from .surgery import *  # noqa: F403

__all__ = [*_core.__all__, *inspection.__all__, *surgery.__all__, *scan.__all__, *plan.__all__]
