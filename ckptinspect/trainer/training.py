"""Training the fixture model and writing its outputs: checkpoints, ``metadata.json``, Keras files.

:func:`train` runs the custom training loop under ``MirroredStrategy`` in a temporary directory
beside ``out_dir`` and renames it into place; :func:`write_keras3_files` and
:func:`write_keras2_files` write the Keras files of the same architecture (:mod:`.net`). The
output rules (``force`` replaces only an earlier trainer output) are here too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import shutil
import uuid
from typing import Any, Callable, Mapping, Sequence

from ..errors import OutputExistsError, UsageError
from ..ops.model.devices import configure_devices  # the operations own it
from .net import NUM_EXAMPLES, OPTIMIZER_NAME, build_keras2_model, build_model, synthetic_data

__all__ = [
    "METADATA_FILE",
    "KERAS3_FILES",
    "KERAS2_FILES",
    "TrainResult",
    "train",
    "write_keras3_files",
    "write_keras2_files",
    "keras2_available",
]

METADATA_FILE = "metadata.json"
METADATA_VERSION = 1
CHECKPOINT_NAME = "ckpt"  # CheckpointManager's default prefix: ckpt-<step>

KERAS3_WEIGHTS = "model.weights.h5"
KERAS3_ZIP = "model.keras"
KERAS3_LEGACY_H5 = "model.h5"
KERAS3_FILES = (KERAS3_WEIGHTS, KERAS3_ZIP, KERAS3_LEGACY_H5)

KERAS2_MODEL_H5 = "keras2_model.h5"
KERAS2_WEIGHTS_H5 = "keras2_weights.h5"
KERAS2_TF_DIR = "keras2_tf"
KERAS2_TF_PREFIX = KERAS2_TF_DIR + "/ckpt"
KERAS2_FILES = (KERAS2_MODEL_H5, KERAS2_WEIGHTS_H5, KERAS2_TF_PREFIX)

DEFAULT_BATCH_PER_REPLICA = 8
DEFAULT_LEARNING_RATE = 1e-2


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`train` wrote.

    Attributes:
        out_dir: The CheckpointManager directory (absolute).
        steps: Training steps run.
        replicas: Replicas (logical CPU devices) trained on.
        saved_steps: Every step a checkpoint was saved at, in order.
        retained: Prefixes of the checkpoints still on disk (``max_to_keep``), oldest first.
        latest: Prefix of the newest checkpoint.
        losses: Training loss of the batch at each saved step.
        num_shards: Data files per checkpoint.
        keras_files: Keras files of the final model that were written (absolute paths).
        metadata_path: The ``metadata.json`` written beside the checkpoints.
    """

    out_dir: str
    steps: int
    replicas: int
    saved_steps: tuple[int, ...]
    retained: tuple[str, ...]
    latest: str
    losses: Mapping[int, float]
    num_shards: int
    keras_files: tuple[str, ...] = ()
    metadata_path: str = ""

    @property
    def retained_steps(self) -> tuple[int, ...]:
        """Step numbers of the retained checkpoints."""
        return tuple(int(p.rsplit("-", 1)[-1]) for p in self.retained)

    def summary(self) -> str:
        """One line: where, how many steps and replicas, what is retained."""
        return (
            f"{self.out_dir}: trained {self.steps} steps on {self.replicas} replicas, "
            f"saved steps {list(self.saved_steps)}, retained {list(self.retained_steps)}, "
            f"{self.num_shards} shard(s) per checkpoint, final loss "
            f"{self.losses[self.saved_steps[-1]]:.4f}"
            + (f", {len(self.keras_files)} Keras file(s)" if self.keras_files else "")
        )


# -- output handling ---------------------------------------------------------------------------


def _check_output_dir(path: pathlib.Path, force: bool) -> None:
    """Refuse a non-empty ``path`` without ``force``, and with it anything the trainer did not write."""
    if path.exists() and not path.is_dir():
        raise OutputExistsError(f"{path}: exists and is not a directory")
    if not path.is_dir() or not any(path.iterdir()):
        return
    if not force:
        raise OutputExistsError(f"{path}: directory is not empty (pass force=True / --force to replace it)")
    if not (path / METADATA_FILE).is_file():
        raise OutputExistsError(
            f"{path}: not empty and has no {METADATA_FILE}, so it is not a trainer output; "
            "refusing to replace it even with force"
        )


def _check_output_files(directory: pathlib.Path, names: Sequence[str], force: bool) -> None:
    if force:
        return
    for name in names:
        target = directory / name.split("/")[0]
        if target.exists():
            raise OutputExistsError(f"{target}: exists (pass force=True / --force to overwrite it)")


def fresh_dir(parent: pathlib.Path, stem: str) -> pathlib.Path:
    """A new empty directory in ``parent`` (created with the umask's mode, unlike mkdtemp)."""
    for _ in range(100):
        path = parent / f"{stem}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
        except FileExistsError:  # pragma: no cover - a uuid collision
            continue
        return path
    raise OutputExistsError(f"{parent}: cannot create a temporary directory")  # pragma: no cover


def replace_dir(tmp: pathlib.Path, out: pathlib.Path) -> None:
    """Move a finished temporary directory into place, replacing ``out``."""
    if out.is_dir():
        shutil.rmtree(out)
    os.replace(tmp, out)


def _versions() -> dict[str, str]:
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    return {"tensorflow": tf.__version__, "keras": keras.__version__, "python": platform.python_version()}


def write_keras3_files(model: Any, out_dir: str | os.PathLike[str], *, force: bool = False) -> list[str]:
    """Write a Keras 3 model as ``model.weights.h5``, ``model.keras`` and legacy ``model.h5``.

    Args:
        model: A built Keras 3 model (compiled to include its optimizer in the full-model files).
        out_dir: Directory to write into (created if missing).
        force: Overwrite existing files.

    Returns:
        The written paths.

    Raises:
        OutputExistsError: A file exists and ``force`` is False.
    """
    directory = pathlib.Path(out_dir)
    _check_output_files(directory, KERAS3_FILES, force)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / name for name in KERAS3_FILES]
    model.save_weights(str(paths[0]), overwrite=True)
    model.save(str(paths[1]), overwrite=True)
    model.save(str(paths[2]), overwrite=True)  # Keras 3 writes the legacy HDF5 format for .h5
    return [str(p) for p in paths]


# -- training ----------------------------------------------------------------------------------


def train(
    out_dir: str | os.PathLike[str],
    *,
    steps: int = 6,
    save_every: int = 2,
    replicas: int = 2,
    max_to_keep: int | None = 3,
    max_shard_bytes: int | None = None,
    seed: int = 0,
    keras_formats: bool = False,
    keras_dir: str | os.PathLike[str] | None = None,
    batch_per_replica: int = DEFAULT_BATCH_PER_REPLICA,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    force: bool = False,
    nan_at: int | None = None,
    nan_variable: str | None = None,
) -> TrainResult:
    """Train the fixture model under MirroredStrategy and save checkpoints into ``out_dir``.

    A checkpoint is saved after every step that is a multiple of ``save_every`` and after the
    last step, as ``ckpt-<step>``. The run is written into a temporary directory beside
    ``out_dir`` and renamed into place when it has finished.

    Args:
        out_dir: The CheckpointManager directory to create. Must be missing or empty, unless
            ``force``, which replaces an earlier output of the trainer (a directory holding a
            ``metadata.json``); other non-empty directories are never replaced.
        steps: Training steps (>= 1).
        save_every: Save interval in steps (>= 1).
        replicas: Logical CPU devices (MirroredStrategy replicas) to train on.
        max_to_keep: Checkpoints the CheckpointManager retains (None keeps all).
        max_shard_bytes: When set, save with ``MaxShardSizePolicy(max_shard_size=...)``: several
            data files per checkpoint, and tensors larger than the limit sliced across them.
        seed: Seed of the initial weights and the synthetic data.
        keras_formats: Also write the final model as ``model.weights.h5``, ``model.keras`` and
            legacy ``model.h5``.
        keras_dir: Where to write those Keras files (default: ``out_dir``).
        batch_per_replica: Examples per replica per step (global batch = this x replicas).
        learning_rate: Adam learning rate.
        force: Replace a non-empty ``out_dir`` and overwrite Keras files.
        nan_at: Plant a fault: after the update of this step (before its save), set every
            value of ``nan_variable`` to NaN (training goes on from there, so later steps
            spread it). Needs ``nan_variable``.
        nan_variable: The model weight to poison, by its Keras path (``head/kernel``) or as
            ``ckptinspect ls`` names it.

    Returns:
        A :class:`TrainResult`.

    Raises:
        UsageError: Bad arguments, or TensorFlow already initialised with too few devices.
        OutputExistsError: ``out_dir`` is not empty (or a Keras file exists) and not ``force``;
            or ``out_dir`` is not empty and not a trainer output.
    """
    for label, value in (("steps", steps), ("save_every", save_every), ("batch_per_replica", batch_per_replica)):
        if value < 1:
            raise UsageError(f"{label} must be at least 1. Received: {label}={value}")
    if max_to_keep is not None and max_to_keep < 1:
        raise UsageError(f"max_to_keep must be at least 1 or None. Received: max_to_keep={max_to_keep}")
    if max_shard_bytes is not None and max_shard_bytes < 1:
        raise UsageError(f"max_shard_bytes must be at least 1. Received: max_shard_bytes={max_shard_bytes}")
    if (nan_at is None) != (nan_variable is None):
        raise UsageError(f"nan_at and nan_variable go together. Received: nan_at={nan_at}, nan_variable={nan_variable!r}")
    if nan_at is not None and not 1 <= nan_at <= steps:
        raise UsageError(f"nan_at must be a step from 1 to {steps}. Received: nan_at={nan_at}")

    out = pathlib.Path(out_dir).absolute()
    kdir = pathlib.Path(keras_dir).absolute() if keras_dir is not None else None
    _check_output_dir(out, force)
    if keras_formats and kdir is not None and kdir != out:
        _check_output_files(kdir, KERAS3_FILES, force)

    # Logical devices first: nothing below may initialise TensorFlow before this.
    devices = configure_devices(replicas)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = fresh_dir(out.parent, f".{out.name}.tmp")
    try:
        result = _train_into(
            tmp,
            out,
            devices=devices,
            steps=steps,
            save_every=save_every,
            max_to_keep=max_to_keep,
            max_shard_bytes=max_shard_bytes,
            seed=seed,
            keras_dir=(kdir or out) if keras_formats else None,
            batch_per_replica=batch_per_replica,
            learning_rate=learning_rate,
            force=force,
            nan_at=nan_at,
            nan_variable=nan_variable,
        )
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _build_in_strategy(devices: list[str], seed: int, learning_rate: float) -> tuple[Any, Any, Any, Any]:
    """The MirroredStrategy over ``devices`` and, in its scope, the model, its Adam optimizer
    (built, compiled in so that the Keras files carry it) and the ``step`` counter."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        model = build_model(seed)
        optimizer = keras.optimizers.Adam(learning_rate=learning_rate, name=OPTIMIZER_NAME)
        optimizer.build(model.trainable_variables)
        # Compiled only so that model.keras / model.h5 carry the optimizer; the loop computes its own
        # loss. A loss object, not "mse": Keras 3 cannot load a legacy .h5 compiled with the string.
        model.compile(optimizer=optimizer, loss=keras.losses.MeanSquaredError())
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    return strategy, model, optimizer, step


def _train_step(strategy: Any, model: Any, optimizer: Any, step: Any, global_batch: int) -> Callable[[Any, Any], Any]:
    """One training step on every replica (the loss averaged over the global batch), counted."""
    import tensorflow as tf  # noqa: PLC0415

    def replica_step(features: Any, targets: Any) -> Any:
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            per_example = tf.reduce_mean(tf.square(predictions - targets), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(features: Any, targets: Any) -> Any:
        per_replica = strategy.run(replica_step, args=(features, targets))
        step.assign_add(1)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


def _metadata(model: Any, optimizer: Any, settings: dict[str, Any], saved: list[dict[str, Any]],
              retained: list[str], latest: str, keras_files: list[str], out: pathlib.Path) -> dict[str, Any]:
    """What ``metadata.json`` records: the settings, every save and what was retained, the
    model's weights, the optimizer and the library versions."""
    retained_names = set(retained)
    return {
        "format_version": METADATA_VERSION,
        **settings,
        "saved": [{**s, "retained": s["checkpoint"] in retained_names} for s in saved],
        "saved_steps": [s["step"] for s in saved],
        "retained": retained,
        "retained_steps": [s["step"] for s in saved if s["checkpoint"] in retained_names],
        "latest": latest,
        "model": {
            "name": model.name,
            "weights": [
                {
                    "name": w.path,
                    "shape": list(w.shape),
                    "dtype": str(w.dtype),
                    "trainable": bool(w.trainable),
                }
                for w in model.weights
            ],
        },
        "optimizer": {"class": type(optimizer).__name__, "learning_rate": settings["learning_rate"]},
        "keras_files": [os.path.relpath(p, out) for p in keras_files],
        "versions": _versions(),
    }


def _train_into(
    tmp: pathlib.Path,
    out: pathlib.Path,
    *,
    devices: list[str],
    steps: int,
    save_every: int,
    max_to_keep: int | None,
    max_shard_bytes: int | None,
    seed: int,
    keras_dir: pathlib.Path | None,
    batch_per_replica: int,
    learning_rate: float,
    force: bool,
    nan_at: int | None = None,
    nan_variable: str | None = None,
) -> TrainResult:
    import tensorflow as tf  # noqa: PLC0415

    replicas = len(devices)
    global_batch = batch_per_replica * replicas
    strategy, model, optimizer, step = _build_in_strategy(devices, seed, learning_rate)
    x, y = synthetic_data(seed)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch, drop_remainder=True)
    batches = iter(strategy.experimental_distribute_dataset(dataset))
    train_step = _train_step(strategy, model, optimizer, step, global_batch)

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp), max_to_keep=max_to_keep, checkpoint_name=CHECKPOINT_NAME)
    options = None
    if max_shard_bytes is not None:
        options = tf.train.CheckpointOptions(
            experimental_sharding_callback=tf.train.experimental.MaxShardSizePolicy(max_shard_size=max_shard_bytes)
        )

    poisoned = _find_weight(model, nan_variable) if nan_variable is not None else None
    saved: list[dict[str, Any]] = []
    for _ in range(steps):
        features, targets = next(batches)
        loss = float(train_step(features, targets).numpy())
        current = int(step.numpy())
        if poisoned is not None and current == nan_at:
            poisoned.assign(tf.fill(poisoned.shape, float("nan")))
        if current % save_every == 0 or current == steps:
            prefix = manager.save(checkpoint_number=current, options=options)
            saved.append({"step": current, "checkpoint": os.path.basename(prefix), "loss": loss})

    retained = [os.path.basename(p) for p in manager.checkpoints]
    latest = os.path.basename(manager.latest_checkpoint)
    num_shards = sum(1 for f in os.listdir(tmp) if f.startswith(latest + ".data-"))

    keras_files: list[str] = []
    if keras_dir is not None:
        target = tmp if keras_dir == out else keras_dir
        written = write_keras3_files(model, target, force=force)
        keras_files = [str(out / pathlib.Path(p).relative_to(tmp)) if keras_dir == out else p for p in written]

    settings = {
        "steps": steps, "save_every": save_every, "replicas": replicas, "max_to_keep": max_to_keep,
        "max_shard_bytes": max_shard_bytes, "num_shards": num_shards, "seed": seed,
        "batch_per_replica": batch_per_replica, "global_batch": global_batch, "learning_rate": learning_rate,
        "nan_at": nan_at, "nan_variable": nan_variable,
    }
    metadata = _metadata(model, optimizer, settings, saved, retained, latest, keras_files, out)
    (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")

    return TrainResult(
        out_dir=str(out),
        steps=steps,
        replicas=replicas,
        saved_steps=tuple(s["step"] for s in saved),
        retained=tuple(str(out / name) for name in retained),
        latest=str(out / latest),
        losses={s["step"]: s["loss"] for s in saved},
        num_shards=num_shards,
        keras_files=tuple(keras_files),
        metadata_path=str(out / METADATA_FILE),
    )


def _find_weight(model: Any, name: str) -> Any:
    """The model weight called ``name`` (its Keras path, with or without ``:0``, or the
    checkpoint name ``ckptinspect ls`` shows: the same path here)."""
    wanted = name.removesuffix(":0")
    for w in model.weights:
        if w.path == wanted or w.path.removesuffix(":0") == wanted:
            return w
    raise UsageError(f"no model weight named {name!r}. Expected one of: {', '.join(w.path for w in model.weights)}")


# -- Keras 2 -----------------------------------------------------------------------------------


def keras2_available() -> bool:
    """Whether ``tf_keras`` (Keras 2) can be imported."""
    try:
        import tf_keras  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def write_keras2_files(
    out_dir: str | os.PathLike[str],
    *,
    seed: int = 0,
    steps: int = 2,
    force: bool = False,
) -> list[str]:
    """Write Keras 2 (``tf_keras``) files of the same architecture into ``out_dir``.

    Builds the model with ``tf_keras``, trains ``steps`` batches with Adam (so optimizer
    weights exist) and writes ``keras2_model.h5`` (full model with optimizer),
    ``keras2_weights.h5`` (weights only) and ``keras2_tf/ckpt`` (TF-format ``save_weights``).

    Args:
        out_dir: Directory to write into (created if missing).
        seed: Seed of the initial weights and the data.
        steps: Training batches before saving (>= 1).
        force: Overwrite existing outputs.

    Returns:
        The written paths (the TF-format one as its prefix).

    Raises:
        UsageError: ``tf_keras`` is not installed, or ``steps`` < 1.
        OutputExistsError: An output exists and ``force`` is False.
    """
    if steps < 1:
        raise UsageError(f"steps must be at least 1. Received: steps={steps}")
    try:
        import tf_keras  # noqa: PLC0415
    except ImportError:
        raise UsageError("writing Keras 2 files needs the tf_keras package (pip install tf-keras)") from None
    directory = pathlib.Path(out_dir)
    _check_output_files(directory, KERAS2_FILES, force)
    directory.mkdir(parents=True, exist_ok=True)
    if force and (directory / KERAS2_TF_DIR).is_dir():
        shutil.rmtree(directory / KERAS2_TF_DIR)

    model = build_keras2_model(tf_keras, seed)
    model.compile(optimizer=tf_keras.optimizers.Adam(DEFAULT_LEARNING_RATE), loss="mse")
    x, y = synthetic_data(seed)
    batch = DEFAULT_BATCH_PER_REPLICA * 2
    for i in range(steps):
        lo = (i * batch) % NUM_EXAMPLES
        model.train_on_batch(x[lo : lo + batch], y[lo : lo + batch])

    paths = [directory / KERAS2_MODEL_H5, directory / KERAS2_WEIGHTS_H5, directory / KERAS2_TF_PREFIX]
    model.save(str(paths[0]), save_format="h5")
    model.save_weights(str(paths[1]), save_format="h5")
    model.save_weights(str(paths[2]), save_format="tf")
    return [str(p) for p in paths]
