"""The Keras family: HDF5 files (legacy ``.h5``, Keras 3 ``.weights.h5``, sharded) and ``.keras`` zips."""
