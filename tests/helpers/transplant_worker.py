"""Run ``ckptinspect transplant`` in this process, then save what the model holds on every replica.

Used by tests/ops/test_transplant.py for the runs that need a fresh process (logical CPU devices for
MirroredStrategy, or one process per MultiWorkerMirroredStrategy worker)::

    python tests/helpers/transplant_worker.py OUT.npz -- SRC DST --builder tests.helpers.transplant_builders:fixture_model ...

Writes ``OUT.npz`` with one array per (model variable, local replica), keyed ``<path>@<replica>``,
and prints one JSON line: ``{"exit_code": ..., "output": <the command's stdout>, "error": <stderr>}``.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str]) -> int:
    out_npz, sep, *cli_args = argv
    if sep != "--":
        raise SystemExit("usage: transplant_worker.py OUT.npz -- TRANSPLANT ARGS...")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    from click.testing import CliRunner

    from ckptinspect.cli import app
    from tests.helpers import transplant_builders

    result = CliRunner().invoke(app, ["transplant", *cli_args])
    arrays = {}
    if transplant_builders.BUILT:
        model = transplant_builders.BUILT[-1]
        for w in model.weights:
            inner = w.value
            strategy = getattr(inner, "_distribute_strategy", None)
            locals_ = strategy.experimental_local_results(inner) if strategy is not None else (inner,)
            for i, local in enumerate(locals_):
                arrays[f"{w.path}@{i}"] = np.asarray(local.numpy())
    np.savez(out_npz, **arrays)
    unexpected = result.exception if not isinstance(result.exception, SystemExit) else None
    print(json.dumps({"exit_code": result.exit_code, "output": result.stdout, "error": result.stderr,
                      "exception": repr(unexpected) if unexpected else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
