"""``extract``: model-only weights written to a TF bundle, ``.weights.h5``, ``.npz`` or ``.safetensors``."""
