"""Builder functions for ``ckptinspect transplant --builder tests.transplant_builders:NAME``.

Each returns a freshly built model (variables created in whatever strategy scope is open). The
models record themselves in :data:`BUILT`, so a worker script that runs the CLI in-process can
read the transplanted weights afterwards.
"""

from __future__ import annotations

from typing import Any

BUILT: list[Any] = []

# Seeds different from the trainer's (0), so a transplanted model differs from a fresh one.
FRESH_SEED = 7
EXTRA_NAME = "extra"
RESIZED_UNITS = 8


def fixture_model() -> Any:
    """The fixture trainer's architecture (``net``), freshly initialised."""
    from ckptinspect.trainer import build_model

    model = build_model(seed=FRESH_SEED)
    BUILT.append(model)
    return model


def changed_model() -> Any:
    """The fixture architecture with one extra layer (``extra``) and a resized ``frozen`` layer."""
    import keras

    from ckptinspect import trainer as t

    inputs = keras.Input(shape=(t.INPUT_DIM,), name="features")
    encoder = keras.Sequential([keras.layers.Dense(t.HIDDEN_DIM, activation="relu", name=t.ENC_DENSE_NAME)],
                               name=t.ENCODER_NAME)
    h = encoder(inputs)
    h = keras.layers.Dense(RESIZED_UNITS, name=t.FROZEN_NAME)(h)
    h = keras.layers.Dense(t.HIDDEN_DIM, name=EXTRA_NAME)(h)
    h = keras.layers.BatchNormalization(name=t.BN_NAME)(h)
    outputs = keras.layers.Dense(t.OUTPUT_DIM, name=t.HEAD_NAME)(h)
    model = keras.Model(inputs, outputs, name=t.MODEL_NAME)
    BUILT.append(model)
    return model


def unbuilt_model() -> Any:
    """A Sequential without an input shape: no variables yet."""
    import keras

    return keras.Sequential([keras.layers.Dense(4, name="head")], name="net")


def failing_model() -> Any:
    """A builder that raises."""
    raise RuntimeError("no GPU here")
