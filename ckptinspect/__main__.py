"""``python -m ckptinspect``."""

from .cli import main

main()
