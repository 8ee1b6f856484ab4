"""``rewrite``: renames, casts and drops applied to a checkpoint, written in its own format."""
