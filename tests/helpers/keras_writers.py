"""Write real Keras files for the Keras reader tests (independent of ckptinspect.trainer).

Every writer builds a small model with real Keras (Keras 3, or Keras 2 through ``tf_keras``),
saves it in one or more formats, and returns the ground truth the tests compare against, taken
from Keras itself: the number of model weights, their paths/names and values, and the number
of optimizer variables. Nothing here uses ckptinspect.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# A layer name long enough that 100 of them overflow HDF5's 64 KiB attribute limit, so Keras
# splits ``layer_names`` into ``layer_names0``, ``layer_names1``.
LONG_NAME_PAD = "x" * 700
SPLIT_LAYERS = 100


def _data(n: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.RandomState(seed).rand(n, *shape).astype("float32")


def _truth(model: Any, names: list[str]) -> dict[str, Any]:
    return {
        "n_weights": len(model.weights),
        "names": names,
        "values": {n: np.asarray(w.numpy()) for n, w in zip(names, model.weights)},
    }


def write_keras3(directory: pathlib.Path) -> dict[str, Any]:
    """A Keras 3 functional model (nested Sequential, BatchNorm) after one fit step.

    Saves ``m.h5`` (legacy full model), ``m.weights.h5`` and ``m.keras``.
    """
    import keras  # noqa: PLC0415

    inp = keras.Input((4,), name="x")
    encoder = keras.Sequential(
        [keras.layers.Dense(8, name="enc_dense"), keras.layers.BatchNormalization(name="enc_bn")],
        name="encoder",
    )
    out = keras.layers.Dense(3, name="head")(encoder(inp))
    model = keras.Model(inp, out, name="ae")
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    model.fit(_data(16, (4,), 0), _data(16, (3,), 1), epochs=1, batch_size=8, verbose=0)
    paths = {
        "h5": directory / "m.h5",
        "weights": directory / "m.weights.h5",
        "keras": directory / "m.keras",
    }
    model.save(paths["h5"])
    model.save_weights(paths["weights"])
    model.save(paths["keras"])
    truth = _truth(model, [w.path for w in model.weights])
    truth.update(
        paths=paths,
        n_optimizer=len(model.optimizer.variables),
        optimizer_name=model.optimizer.name,  # "adam", or "adam_1" when others were made first
        keras_version=keras.__version__,
        layer_vars={layer_path: n for layer_path, n in _layer_var_counts(model).items()},
    )
    return truth


def _layer_var_counts(model: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in model.weights:
        layer_path = w.path.rsplit("/", 1)[0]
        counts[layer_path] = counts.get(layer_path, 0) + 1
    return counts


def write_keras3_zoo(directory: pathlib.Path) -> dict[str, Any]:
    """A Keras 3 functional model with Embedding, Conv1D, LayerNorm, LSTM, bias-less Dense.

    Saves ``zoo.keras`` and ``zoo.weights.h5``.
    """
    import keras  # noqa: PLC0415

    inp = keras.Input((6,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(10, 4, name="emb")(inp)
    x = keras.layers.Conv1D(3, 2, name="conv")(x)
    x = keras.layers.LayerNormalization(name="ln")(x)
    x = keras.layers.LSTM(4, name="rnn")(x)
    x = keras.layers.Dense(2, use_bias=False, name="out")(x)
    model = keras.Model(inp, x, name="zoo")
    model(np.zeros((1, 6), "int32"))
    paths = {"keras": directory / "zoo.keras", "weights": directory / "zoo.weights.h5"}
    model.save(paths["keras"])
    model.save_weights(paths["weights"])
    truth = _truth(model, [w.path for w in model.weights])
    truth.update(paths=paths)
    return truth


def write_keras3_subclassed(directory: pathlib.Path) -> dict[str, Any]:
    """A subclassed Keras 3 model: its own weight, a nested Sequential, an LSTM, a bfloat16 head.

    Saves ``sub.weights.h5``.
    """
    import keras  # noqa: PLC0415

    class Sub(keras.Model):
        def __init__(self):
            super().__init__(name="sub")
            self.encoder = keras.Sequential([keras.layers.Dense(8, name="enc_dense")], name="encoder")
            self.rnn = keras.layers.LSTM(4, name="rnn")
            self.head = keras.layers.Dense(2, name="head", dtype="bfloat16")
            self.extra = self.add_weight(shape=(3,), name="extra", initializer="ones")

        def call(self, x):
            return self.head(self.rnn(self.encoder(x)))

    model = Sub()
    model(np.zeros((1, 5, 3), "float32"))
    path = directory / "sub.weights.h5"
    model.save_weights(path)
    truth = _truth(model, [w.path for w in model.weights])
    truth.update(paths={"weights": path}, dtypes={w.path: str(w.dtype) for w in model.weights})
    return truth


def write_keras3_sharded(directory: pathlib.Path) -> dict[str, Any]:
    """Keras 3 ``save_weights(..., max_shard_size=...)`` small enough to give several shards."""
    import keras  # noqa: PLC0415

    model = keras.Sequential(
        [keras.Input((20,)), keras.layers.Dense(300, name="a"), keras.layers.Dense(300, name="b"),
         keras.layers.Dense(2, name="c")],
        name="wide",
    )
    model.compile(keras.optimizers.Adam(), "mse")
    model.fit(_data(8, (20,), 2), _data(8, (2,), 3), epochs=1, verbose=0)
    index = directory / "wide.weights.json"
    model.save_weights(index, max_shard_size=0.0004)  # GB: ~430 KB per shard
    truth = _truth(model, [w.path for w in model.weights])
    truth.update(paths={"index": index}, n_optimizer=len(model.optimizer.variables))
    return truth


def write_tf_keras(directory: pathlib.Path) -> dict[str, Any]:
    """Keras 2 (tf_keras): a functional model with a nested Sequential after one fit step.

    Saves ``k2.h5`` (full model with optimizer state) and ``k2w.h5`` (``save_weights``).
    """
    import tf_keras  # noqa: PLC0415

    inp = tf_keras.Input((4,))
    encoder = tf_keras.Sequential(
        [tf_keras.layers.Dense(8, name="enc_dense"), tf_keras.layers.BatchNormalization(name="enc_bn")],
        name="encoder",
    )
    out = tf_keras.layers.Dense(3, name="head")(encoder(inp))
    model = tf_keras.Model(inp, out, name="ae2")
    model.compile(tf_keras.optimizers.Adam(1e-2), "mse")
    model.fit(_data(16, (4,), 4), _data(16, (3,), 5), epochs=1, batch_size=8, verbose=0)
    paths = {"h5": directory / "k2.h5", "weights": directory / "k2w.h5"}
    model.save(str(paths["h5"]))
    model.save_weights(str(paths["weights"]))
    truth = _truth(model, [w.name for w in model.weights])
    truth.update(
        paths=paths,
        n_optimizer=len(model.optimizer.variables),
        keras_version=tf_keras.__version__,
    )
    return truth


def write_split_layer_names(directory: pathlib.Path) -> dict[str, Any]:
    """Sequential models with enough long-named layers that ``layer_names`` is split.

    Saves ``split_k2.h5`` (tf_keras) and ``split_k3.h5`` (Keras 3 legacy h5).
    """
    import keras  # noqa: PLC0415
    import tf_keras  # noqa: PLC0415

    def layers(mod):
        return [mod.layers.Dense(1, name=f"layer_{i:04d}_{LONG_NAME_PAD}") for i in range(SPLIT_LAYERS)]

    k2 = tf_keras.Sequential([tf_keras.Input((2,)), *layers(tf_keras)])
    k3 = keras.Sequential([keras.Input((2,)), *layers(keras)])
    paths = {"k2": directory / "split_k2.h5", "k3": directory / "split_k3.h5"}
    k2.save(str(paths["k2"]))
    k3.save(paths["k3"])
    return {"paths": paths, "n_weights": {"k2": len(k2.weights), "k3": len(k3.weights)}}
