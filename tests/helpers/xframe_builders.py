"""Keras 3 builders matching the PyTorch fixtures (fixtures/torch/make_fixtures.py), for
``--builder xframe_builders:FUNCTION`` (the tests directory is importable)."""

from __future__ import annotations

# fixtures/torch MLP: Linear(4, 8) -> BatchNorm1d(8) -> Linear(8, 3).
MLP_INPUT, MLP_HIDDEN, MLP_OUTPUT = 4, 8, 3


def mlp():
    """The Keras 3 twin of the torch fixtures' ``MLP``: Dense ``fc1``, BatchNormalization ``bn``,
    Dense ``fc2``, built."""
    import keras  # noqa: PLC0415

    inputs = keras.Input((MLP_INPUT,))
    h = keras.layers.Dense(MLP_HIDDEN, activation="relu", name="fc1")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    outputs = keras.layers.Dense(MLP_OUTPUT, name="fc2")(h)
    return keras.Model(inputs, outputs, name="mlp")
