"""Builder functions for ``ckptinspect transplant --builder tests.helpers.transplant_builders:NAME``.

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


def _architecture(*, encoder: str, enc_dense: str, frozen: str, bn: str, head: str,
                  frozen_units: int | None = None, extra: str | None = None) -> Any:
    """The fixture architecture with other layer names, a resized ``frozen`` or an extra layer."""
    import keras

    from ckptinspect.trainer import net as t

    inputs = keras.Input(shape=(t.INPUT_DIM,), name="features")
    h = keras.Sequential([keras.layers.Dense(t.HIDDEN_DIM, activation="relu", name=enc_dense)], name=encoder)(inputs)
    h = keras.layers.Dense(frozen_units or t.HIDDEN_DIM, name=frozen)(h)
    if extra:
        h = keras.layers.Dense(t.HIDDEN_DIM, name=extra)(h)
    h = keras.layers.BatchNormalization(name=bn)(h)
    outputs = keras.layers.Dense(t.OUTPUT_DIM, name=head)(h)
    model = keras.Model(inputs, outputs, name=t.MODEL_NAME)
    BUILT.append(model)
    return model


FIXTURE_NAMES = {"encoder": "encoder", "enc_dense": "enc_dense", "frozen": "frozen", "bn": "bn", "head": "head"}
RENAMED_HEAD = "classifier"


def changed_model() -> Any:
    """The fixture architecture with one extra layer (``extra``) and a resized ``frozen`` layer."""
    return _architecture(**FIXTURE_NAMES, frozen_units=RESIZED_UNITS, extra=EXTRA_NAME)


def resized_model() -> Any:
    """The fixture architecture with ``frozen`` resized (so ``bn`` and ``head`` change too)."""
    return _architecture(**FIXTURE_NAMES, frozen_units=RESIZED_UNITS)


def renamed_head_model() -> Any:
    """The fixture architecture with ``head`` named ``classifier``."""
    return _architecture(**{**FIXTURE_NAMES, "head": RENAMED_HEAD})


def anonymous_model() -> Any:
    """The fixture architecture with none of its layer names (only order and shapes tell)."""
    return _architecture(**{k: f"layer{i}" for i, k in enumerate(FIXTURE_NAMES)})


def unbuilt_model() -> Any:
    """A Sequential without an input shape: no variables yet."""
    import keras

    return keras.Sequential([keras.layers.Dense(4, name="head")], name="net")


def failing_model() -> Any:
    """A builder that raises."""
    raise RuntimeError("no GPU here")


def k206_driving_model() -> Any:
    """Keras 3 rebuild of the real-world Keras 2.0.6 ``keras2-h5-full-k206/model.h5`` (a behavioural
    cloning CNN): same layer names, the ``Lambda`` normalisation replaced by ``Rescaling``."""
    import keras

    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input(shape=(64, 64, 3)),
            layers.Rescaling(1 / 255.0, offset=-0.5, name="lambda_1"),
            layers.Conv2D(24, 5, strides=2, activation="relu", name="conv2d_1"),
            layers.Dropout(0.4, name="dropout_1"),
            layers.Conv2D(36, 5, strides=2, activation="relu", name="conv2d_2"),
            layers.Dropout(0.4, name="dropout_2"),
            layers.Conv2D(48, 3, strides=2, activation="relu", name="conv2d_3"),
            layers.Flatten(name="flatten_1"),
            layers.Dense(60, name="dense_1"),
            layers.Dropout(0.4, name="dropout_3"),
            layers.Dense(10, name="dense_2"),
            layers.Dropout(0.4, name="dropout_4"),
            layers.Dense(1, name="dense_3"),
        ],
        name="sequential_1",
    )
    BUILT.append(model)
    return model


def textgen_model() -> Any:
    """Keras 3 rebuild of the real-world ``tf2-textgen-keras-weights`` model (a tf.keras
    ``save_weights`` TF-format checkpoint, which Keras 3 cannot read): Embedding, LSTM, Dense."""
    import keras

    inputs = keras.Input(shape=(None,), dtype="int32")
    h = keras.layers.Embedding(127, 16, name="embedding")(inputs)
    h = keras.layers.LSTM(32, return_sequences=True, name="lstm")(h)
    model = keras.Model(inputs, keras.layers.Dense(127, name="dense")(h), name="textgen")
    BUILT.append(model)
    return model


# The fixture's layers in the same order and shapes, flat (no nested ``encoder``) and named
# otherwise (issue 25 item 3): only layer order and shape tell which layer is which.
FLAT_NAMES = ("fc1", "fixed", "norm", "classifier")
FLAT_PAIRS = dict(zip(FLAT_NAMES, ("encoder", "frozen", "bn", "head")))  # flat layer -> fixture layer
WIDE_HEAD_UNITS = 5


def _flat(head_units: int, head_seed: int | None = None) -> Any:
    import keras

    from ckptinspect.trainer import net as t

    fc1, fixed, norm, classifier = FLAT_NAMES
    inputs = keras.Input(shape=(t.INPUT_DIM,), name="features")
    h = keras.layers.Dense(t.HIDDEN_DIM, activation="relu", name=fc1)(inputs)
    h = keras.layers.Dense(t.HIDDEN_DIM, name=fixed)(h)
    h = keras.layers.BatchNormalization(name=norm)(h)
    kernel = keras.initializers.GlorotUniform(seed=head_seed) if head_seed is not None else "glorot_uniform"
    outputs = keras.layers.Dense(head_units, name=classifier, kernel_initializer=kernel)(h)
    model = keras.Model(inputs, outputs, name="flat")
    BUILT.append(model)
    return model


def flat_model() -> Any:
    """The fixture's layers, flat, named ``fc1``, ``fixed``, ``norm``, ``classifier``."""
    from ckptinspect.trainer import net as t

    return _flat(t.OUTPUT_DIM)


def flat_wide_head_model() -> Any:
    """:func:`flat_model` with a head of 5 units where the fixture's has 4; the head's initial
    kernel is seeded (:data:`FRESH_SEED`), so every build holds the same initial head."""
    return _flat(WIDE_HEAD_UNITS, head_seed=FRESH_SEED)


def headless_model() -> Any:
    """The fixture architecture without its ``head`` layer (a backbone: the source has more)."""
    import keras

    from ckptinspect.trainer import net as t

    inputs = keras.Input(shape=(t.INPUT_DIM,), name="features")
    h = keras.Sequential([keras.layers.Dense(t.HIDDEN_DIM, activation="relu", name="enc_dense")], name="encoder")(inputs)
    h = keras.layers.Dense(t.HIDDEN_DIM, name="frozen")(h)
    outputs = keras.layers.BatchNormalization(name="bn")(h)
    model = keras.Model(inputs, outputs, name=t.MODEL_NAME)
    BUILT.append(model)
    return model
