"""``plan``: how often to save, and what it costs."""
