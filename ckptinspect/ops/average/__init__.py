"""``average``: the mean or EMA of checkpoints of one run."""
