"""Keras 3 Orbax checkpoints (``keras.callbacks.OrbaxCheckpoint``, orbax-checkpoint's OCDBT + zarr3
layout), read with tensorstore (the ``ckptinspect[orbax]`` extra), never with JAX or orbax:
``sniff`` (detection, standard library only), ``layout`` (the step's plain JSON files), ``step``
(the reader and ``verify``'s check) and ``run`` (a directory of numbered steps: the series)."""
