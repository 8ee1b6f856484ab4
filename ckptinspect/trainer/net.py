"""The fixture architecture (``net``) and its synthetic data: what the trainer trains.

:func:`build_model` builds it with Keras 3 in whatever ``tf.distribute`` strategy scope is
open; :func:`build_net` with any Keras API module (``keras`` 3 or ``tf_keras``), so the Keras 2
files have the same layers. The layer names are module constants, so that readable names
appear in checkpoints (see :mod:`ckptinspect.trainer`).
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError

__all__ = ["build_model", "build_net", "build_keras2_model", "synthetic_data"]

INPUT_DIM = 8
HIDDEN_DIM = 16
OUTPUT_DIM = 4
MODEL_NAME = "net"
ENCODER_NAME = "encoder"
ENC_DENSE_NAME = "enc_dense"
FROZEN_NAME = "frozen"
BN_NAME = "bn"
HEAD_NAME = "head"
OPTIMIZER_NAME = "adam"

NUM_EXAMPLES = 256


def build_model(seed: int = 0) -> Any:
    """Build the fixture architecture as an (uncompiled, built) Keras 3 functional model.

    Variables are created in whatever ``tf.distribute`` strategy scope is open, so calling it
    under ``strategy.scope()`` gives mirrored variables. Initializers are seeded, so the same
    ``seed`` gives the same initial weights.

    Args:
        seed: Seed of the weight initializers.

    Returns:
        ``keras.Model`` named ``net`` with weights ``encoder/enc_dense/{kernel,bias}``,
        ``frozen/{kernel,bias}`` (not trainable), ``bn/{gamma,beta,moving_mean,
        moving_variance}`` and ``head/{kernel,bias}``.

    Raises:
        UsageError: The installed ``keras`` is not Keras 3.
    """
    import keras  # noqa: PLC0415

    if int(keras.__version__.split(".")[0]) < 3:
        raise UsageError(f"the fixture trainer needs Keras 3. Received: keras {keras.__version__}")

    return build_net(keras, seed)


def build_net(k: Any, seed: int) -> Any:
    """The fixture architecture with Keras API module ``k`` (``keras`` 3 or ``tf_keras``)."""

    def init(offset: int) -> Any:
        return k.initializers.GlorotUniform(seed=seed * 100 + offset)

    inputs = k.Input(shape=(INPUT_DIM,), name="features")
    encoder = k.Sequential(
        [k.layers.Dense(HIDDEN_DIM, activation="relu", kernel_initializer=init(1), name=ENC_DENSE_NAME)],
        name=ENCODER_NAME,
    )
    h = encoder(inputs)
    frozen = k.layers.Dense(
        HIDDEN_DIM,
        kernel_initializer=init(2),
        bias_initializer=k.initializers.Constant(0.1),
        name=FROZEN_NAME,
    )
    frozen.trainable = False
    h = frozen(h)
    h = k.layers.BatchNormalization(name=BN_NAME)(h)
    outputs = k.layers.Dense(OUTPUT_DIM, kernel_initializer=init(3), name=HEAD_NAME)(h)
    return k.Model(inputs, outputs, name=MODEL_NAME)


def build_keras2_model(tf_keras: Any, seed: int) -> Any:
    """The fixture architecture built with Keras 2 (the ``tf_keras`` module)."""
    return build_net(tf_keras, seed)


def synthetic_data(seed: int) -> tuple[Any, Any]:
    """``NUM_EXAMPLES`` seeded examples: float32 features and noisy targets of a fixed tanh map."""
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(NUM_EXAMPLES, INPUT_DIM)).astype(np.float32)
    w = rng.normal(size=(INPUT_DIM, OUTPUT_DIM)).astype(np.float32)
    y = (np.tanh(x @ w) + 0.05 * rng.normal(size=(NUM_EXAMPLES, OUTPUT_DIM))).astype(np.float32)
    return x, y
