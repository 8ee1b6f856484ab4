"""Builders and writers for tests/ops/test_doctor.py (``--builder tests.helpers.doctor_builders:NAME``).

``keras3_from_legacy_h5`` builds the Keras 3 equivalent of the CNN whose Keras 2 weights file
is named by ``$DOCTOR_TEST_H5``: the layers, their kinds and their kernel shapes are read from
the file (``layer_names``, ``weight_names``), the input size is worked back from the first
Dense layer's input width, and the layers are named as a fresh Keras 3 session names them
(``conv2d, conv2d_1, dense, dense_1...``, where Keras 2 said ``conv2d_1, conv2d_2, dense_1``).
``$DOCTOR_TEST_RESIZE=layer:units`` resizes one Dense layer of the rebuild.

``write_keras2_cnn`` writes our own small Keras 2 file of the same kind with ``tf_keras``;
``write_tf1_estimator_checkpoint`` a TF1 Saver checkpoint with Estimator-style names.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

H5_ENV = "DOCTOR_TEST_H5"
RESIZE_ENV = "DOCTOR_TEST_RESIZE"
# tf.compat.v1 layers of the TF1 checkpoint, and the Keras 3 model that should take them.
TF1_UNITS = (4, 8, 8, 8, 3)  # input, three hidden Dense, logits (two hidden layers share a shape)
TF1_MODEL_LAYERS = ("hidden1", "hidden2", "hidden3", "logits")
TF1_MODEL_NAME = "mlp"
BUILT: list[Any] = []


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def legacy_layers(path: str) -> list[tuple[str, list[tuple[int, ...]]]]:
    """``(layer name, [weight shapes])`` of a Keras 2 weights file, in ``layer_names`` order."""
    import h5py

    with h5py.File(path, "r") as f:
        out = []
        for name in (_text(n) for n in f.attrs["layer_names"]):
            group = f[name]
            out.append((name, [tuple(group[_text(w)].shape) for w in group.attrs.get("weight_names", [])]))
        return out


def legacy_values(path: str) -> dict[str, list[Any]]:
    """Per layer, its weights as the file stores them (h5py, in ``weight_names`` order)."""
    import h5py

    with h5py.File(path, "r") as f:
        return {
            _text(n): [f[_text(n)][_text(w)][()] for w in f[_text(n)].attrs.get("weight_names", [])]
            for n in f.attrs["layer_names"]
        }


def keras3_names(layers: list[tuple[str, Any]]) -> list[str]:
    """Keras 3 names of a fresh session: each kind numbered from 0 (``dense, dense_1``)."""
    counts: dict[str, int] = {}
    out = []
    for name, _ in layers:
        base = re.sub(r"_\d+$", "", name)
        n = counts.get(base, 0)
        counts[base] = n + 1
        out.append(base if n == 0 else f"{base}_{n}")
    return out


def keras3_from_legacy_h5() -> Any:
    """The Keras 3 CNN equivalent to ``$DOCTOR_TEST_H5`` (see the module docstring)."""
    import keras

    layers = legacy_layers(os.environ[H5_ENV])
    resize_name, _, resize_units = os.environ.get(RESIZE_ENV, "").partition(":")
    names = keras3_names(layers)
    kinds = [re.sub(r"_\d+$", "", n) for n, _ in layers]
    # Input side: the flattened width over the last conv's channels, worked back through the layers.
    flat = kinds.index("flatten")
    first_dense = next(s for k, (_, s) in zip(kinds[flat:], layers[flat:]) if k == "dense")
    last_conv = next(s for k, (_, s) in zip(reversed(kinds[:flat]), reversed(layers[:flat])) if k == "conv2d")
    side = math.isqrt(first_dense[0][0] // last_conv[0][3])
    for kind, (_, shapes) in zip(reversed(kinds[:flat]), reversed(layers[:flat])):
        if kind == "max_pooling2d":
            side *= 2
        elif kind == "conv2d":
            side += shapes[0][0] - 1
    first_conv = next(s for k, (_, s) in zip(kinds, layers) if k == "conv2d")
    built = [keras.Input((side, side, first_conv[0][2]))]
    for kind, name, (_, shapes) in zip(kinds, names, layers):
        if kind == "conv2d":
            built.append(keras.layers.Conv2D(shapes[0][3], shapes[0][:2], activation="relu", name=name))
        elif kind == "max_pooling2d":
            built.append(keras.layers.MaxPooling2D(name=name))
        elif kind == "dropout":
            built.append(keras.layers.Dropout(0.2, name=name))
        elif kind == "flatten":
            built.append(keras.layers.Flatten(name=name))
        elif kind == "dense":
            units = int(resize_units) if name == resize_name else shapes[0][1]
            built.append(keras.layers.Dense(units, name=name))
        else:  # pragma: no cover - a file of another kind of model
            raise ValueError(f"no Keras 3 equivalent for layer {name!r}")
    model = keras.Sequential(built, name="sequential")
    BUILT.append(model)
    return model


def write_keras2_cnn(path: str) -> None:
    """A Keras 2 (tf_keras) ``save_weights`` HDF5 file of a small CNN named as Keras 2.1.4 names
    its layers (numbered from 1), like the real-world ``keras2-h5-weights-k214`` file."""
    import tf_keras

    layers = tf_keras.layers
    model = tf_keras.Sequential([
        tf_keras.Input((12, 12, 1)),
        layers.Conv2D(6, 5, activation="relu", name="conv2d_1"),
        layers.MaxPooling2D(name="max_pooling2d_1"),
        layers.Conv2D(4, 3, activation="relu", name="conv2d_2"),
        layers.MaxPooling2D(name="max_pooling2d_2"),
        layers.Dropout(0.2, name="dropout_1"),
        layers.Flatten(name="flatten_1"),
        layers.Dense(8, activation="relu", name="dense_1"),
        layers.Dense(6, activation="relu", name="dense_2"),
        layers.Dense(3, name="dense_3"),
    ])
    model.save_weights(path)


def write_tf1_estimator_checkpoint(prefix: str, seed: int = 0) -> str:
    """A TF1 ``tf.compat.v1.train.Saver`` checkpoint of an MLP with Estimator-style names
    (``dense/kernel``, ``dense_1/kernel``... as ``tf.layers.dense`` makes them), Adam slots,
    ``beta1_power``/``beta2_power`` and ``global_step``, after one training step. Returns the
    written prefix."""
    import numpy as np
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, (None, TF1_UNITS[0]))
        h = x
        for i, (n_in, n_out) in enumerate(zip(TF1_UNITS, TF1_UNITS[1:])):
            with v1.variable_scope("dense" if i == 0 else f"dense_{i}"):
                kernel = v1.get_variable("kernel", (n_in, n_out), initializer=v1.glorot_uniform_initializer())
                bias = v1.get_variable("bias", (n_out,), initializer=v1.random_normal_initializer())
            h = tf.matmul(h, kernel) + bias
            if i < len(TF1_UNITS) - 2:
                h = tf.nn.relu(h)
        step = v1.train.get_or_create_global_step()
        train = v1.train.AdamOptimizer(0.01).minimize(tf.reduce_mean(tf.square(h)), global_step=step)
        saver = v1.train.Saver()
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train, {x: np.ones((2, TF1_UNITS[0]), np.float32)})
            return saver.save(sess, prefix, global_step=step)


def tf1_mlp() -> Any:
    """The Keras 3 model the TF1 checkpoint should load into: other layer names (``hidden1``...)."""
    import keras

    units = TF1_UNITS[1:]
    model = keras.Sequential(
        [keras.Input((TF1_UNITS[0],)), *(keras.layers.Dense(u, name=n) for u, n in zip(units, TF1_MODEL_LAYERS))],
        name=TF1_MODEL_NAME,
    )
    BUILT.append(model)
    return model


def torch_like_net() -> Any:
    """A Keras 3 CNN whose weights a PyTorch-layout ``.npz`` (OIHW convs, ``[out,in]`` Linear) holds."""
    import keras

    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(3, (3, 2), name="conv"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(5, name="fc"),
    ], name="net")
    BUILT.append(model)
    return model
