"""``python -m ckptinspect.trainer``: see :func:`ckptinspect.trainer.fixtures.main`."""

import sys

from .fixtures import main

if __name__ == "__main__":
    sys.exit(main())
