"""Keras 3 Orbax checkpoints (``keras.callbacks.OrbaxCheckpoint``, orbax-checkpoint's OCDBT + zarr3
layout), read without JAX or orbax (the ``ckptinspect[orbax]`` extra: tensorstore, zstandard):
``sniff`` (detection, standard library only), ``layout`` (the step's plain JSON files), ``ocdbt``
(a read-only OCDBT reader: what the listing needs, without tensorstore), ``step`` (the reader:
values streamed from the chunks' zstd frames or read through tensorstore, and ``verify``'s check)
and ``run`` (a directory of numbered steps: the series)."""
