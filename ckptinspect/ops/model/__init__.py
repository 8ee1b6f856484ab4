"""The live-model side: building a model (``--builder``), its variables and strategy, assigning
values, writing weights through it, and ``transplant``."""
