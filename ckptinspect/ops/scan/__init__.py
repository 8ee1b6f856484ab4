"""``scan``: every checkpoint of a run in step order, in one streamed pass."""
