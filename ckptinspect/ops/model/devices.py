"""Devices and ``tf.distribute`` strategies: what ``transplant --strategy`` and the fixture
trainer set up before TensorFlow starts.

TensorFlow is imported inside the functions (:func:`ckptinspect._tf.import_tf`, re-exported
here), never at import time.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, ContextManager

from ..._tf import import_tf, optional_tf, silenced_stderr
from ...errors import UsageError

__all__ = [
    "STRATEGIES",
    "STRATEGY_DEFAULT",
    "STRATEGY_MIRRORED",
    "STRATEGY_MULTI_WORKER",
    "DEFAULT_MIRRORED_REPLICAS",
    "import_tf",
    "optional_tf",
    "quiet_devices",
    "configure_devices",
    "make_strategy",
]

STRATEGY_DEFAULT = "default"
STRATEGY_MIRRORED = "mirrored"
STRATEGY_MULTI_WORKER = "multi-worker"
STRATEGIES = (STRATEGY_DEFAULT, STRATEGY_MIRRORED, STRATEGY_MULTI_WORKER)
DEFAULT_MIRRORED_REPLICAS = 2
TF_LOGS_ENV = "CKPTINSPECT_TF_LOGS"
TF_CONFIG_ENV = "TF_CONFIG"


def quiet_devices() -> ContextManager[None]:
    """Silence TensorFlow's C++ device start-up lines (``cuInit`` on CPU-only machines), as the
    import is silenced (``CKPTINSPECT_TF_LOGS=1`` shows them)."""
    if os.environ.get(TF_LOGS_ENV):
        return contextlib.nullcontext()
    return silenced_stderr()


def configure_devices(replicas: int) -> list[str]:
    """Split the physical CPU into at least ``replicas`` logical devices.

    Must run before TensorFlow initialises its devices (before any op). If TensorFlow already
    has enough logical CPU devices, the first ``replicas`` are used as they are.

    Args:
        replicas: Logical CPU devices wanted (>= 1).

    Returns:
        The names of ``replicas`` logical CPU devices.

    Raises:
        UsageError: ``replicas`` < 1, or TensorFlow is already initialised with fewer logical
            CPU devices.
    """
    if replicas < 1:
        raise UsageError(f"replicas must be at least 1. Received: replicas={replicas}")
    tf = import_tf()
    cpus = tf.config.list_physical_devices("CPU")
    if not cpus:  # pragma: no cover - TensorFlow always has a CPU
        raise UsageError("TensorFlow reports no physical CPU device")
    current = tf.config.get_logical_device_configuration(cpus[0]) or []
    if len(current) < replicas:
        try:
            tf.config.set_logical_device_configuration(
                cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
            )
        except RuntimeError:
            pass  # already initialised: checked below
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < replicas:
        raise UsageError(
            f"TensorFlow is already initialised with {len(devices)} logical CPU device(s), and "
            f"logical devices cannot be added afterwards; training with replicas={replicas} "
            "needs a fresh process: call ckptinspect.trainer.train (or configure_devices) "
            "before any other TensorFlow op, or run `ckptinspect train` / "
            "`python -m ckptinspect.trainer`."
        )
    return devices[:replicas]


def make_strategy(name: str, replicas: int | None = None) -> Any:
    """Create the ``tf.distribute`` strategy ``transplant --strategy`` names.

    For ``mirrored``, ``replicas`` logical CPU devices are configured first, which works only
    before TensorFlow has initialised its devices (call this first in the process).

    Args:
        name: ``default``, ``mirrored`` or ``multi-worker`` (reads ``TF_CONFIG``).
        replicas: Replicas of ``mirrored`` (default 2); not allowed with the others.

    Returns:
        The strategy.

    Raises:
        UsageError: Unknown name, ``replicas`` with another strategy, multi-worker without
            ``TF_CONFIG``, or too few devices.
    """
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy {name!r}; expected one of {', '.join(STRATEGIES)}")
    if replicas is not None and name != STRATEGY_MIRRORED:
        raise UsageError(f"--replicas applies to --strategy mirrored only. Received: --strategy {name}")
    tf = import_tf()
    if name == STRATEGY_DEFAULT:
        with quiet_devices():
            tf.config.list_logical_devices()
        return tf.distribute.get_strategy()
    if name == STRATEGY_MIRRORED:
        with quiet_devices():
            devices = configure_devices(DEFAULT_MIRRORED_REPLICAS if replicas is None else replicas)
        return tf.distribute.MirroredStrategy(devices)
    if not os.environ.get(TF_CONFIG_ENV):
        raise UsageError(
            "--strategy multi-worker needs TF_CONFIG (the cluster and this worker's task), e.g. "
            '{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, "task": {"type": "worker", "index": 0}}'
        )
    try:
        return tf.distribute.MultiWorkerMirroredStrategy()
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"TF_CONFIG: cannot start MultiWorkerMirroredStrategy: {e}") from None
