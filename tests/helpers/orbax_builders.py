"""The Keras model of fixtures/orbax (``--builder orbax_builders:build_model``): the architecture
``fixtures/orbax/make_fixtures.py`` trains, built fresh (its weights are what a test loads)."""

from __future__ import annotations

INPUTS, HIDDEN, OUTPUTS = 32, 32, 8


def build_model():
    import keras

    model = keras.Sequential(
        [
            keras.Input((INPUTS,)),
            keras.layers.Dense(HIDDEN, activation="relu", name="dense_1"),
            keras.layers.BatchNormalization(name="batch_normalization"),
            keras.layers.Dense(OUTPUTS, name="dense_2"),
        ],
        name="sequential",
    )
    return model
