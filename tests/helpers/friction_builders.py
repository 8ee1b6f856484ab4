"""Builders for the issue 25 friction tests (``--builder tests.helpers.friction_builders:NAME``).

``chatty_model`` prints while its module is imported and while it builds (``model.summary()``),
as real builders do; ``stranger_model`` shares nothing with the fixture run, so a strict
``transplant`` finds many problems.
"""

from __future__ import annotations

from typing import Any

print("friction_builders imported")  # noqa: T201 - a builder module's own print, on purpose


def chatty_model() -> Any:
    """The fixture trainer's architecture, announced and summarised on stdout."""
    from ckptinspect.trainer import build_model

    print("building the model")  # noqa: T201
    model = build_model(seed=7)
    model.summary()
    return model


def stranger_model() -> Any:
    """Four Dense layers of sizes the fixture run has none of: every weight is a problem."""
    import keras

    inputs = keras.Input((3,))
    x = inputs
    for i, units in enumerate((5, 7, 9, 11)):
        x = keras.layers.Dense(units, name=f"stranger_{i}")(x)
    return keras.Model(inputs, x, name="stranger")
