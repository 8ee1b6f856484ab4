"""``diff``: two checkpoints compared variable by variable, streamed."""
