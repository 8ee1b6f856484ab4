"""``doctor``: why a checkpoint's weights will not load into a model, and the fix."""
