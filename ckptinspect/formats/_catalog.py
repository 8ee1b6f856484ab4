"""The built-in formats, in detection order: one :func:`~._registry.register` line each (see
docs/ARCHITECTURE.md, "Adding a format"). Imported by the door when the package loads."""

from __future__ import annotations

from .. import model as m
from ._registry import (
    AFTER_FILES,
    AT_DIRECTORY,
    AT_FILE,
    AT_PREFIX,
    BEFORE_FILES,
    MISSING,
    FormatSpec,
    Probe,
    refusal,
    register,
)
from .hf import sniff as hf
from .keras import sniff as keras
from .orbax import sniff as orbax
from .safetensors import sniff as safetensors
from .tf import sniff as tf
from .torch import sniff as torch


def _npz_file(probe: Probe) -> str | None:
    """A zip archive of ``.npy`` members (numpy loads for zip files only)."""
    if probe.head(4) != b"PK\x03\x04":
        return None
    from .npz import is_npz  # noqa: PLC0415

    return probe.path if is_npz(probe.path) else None


def _file_series(probe: Probe) -> str | None:
    """A directory of checkpoint files a training callback wrote (see :mod:`.series`)."""
    from .series import file_series_kind  # noqa: PLC0415 - only for directories

    return probe.path if file_series_kind(probe.path) is not None else None


_TF = ("object-graph", "slices", "stored-bytes", "checksums", "tf-restorable", "writable")
register(FormatSpec("tf-bundle", "tf", AT_PREFIX, tf.bundle_prefix, open="tf.bundle:open_bundle",
                    check="tf.bundle:check_bundle_prefix", formats=(m.FORMAT_TF_BUNDLE,), capabilities=_TF,
                    describe="a TF checkpoint prefix or its .index file"))
register(FormatSpec("tf-savedmodel", "tf", AT_DIRECTORY, tf.savedmodel_directory,
                    open="tf.bundle:open_savedmodel", check="tf.bundle:check_savedmodel",
                    formats=(m.FORMAT_TF_SAVEDMODEL,), capabilities=_TF, describe="a SavedModel directory"))
register(FormatSpec("orbax", "orbax", AT_DIRECTORY, orbax.step_directory, open="orbax.step:open_orbax",
                    check="orbax.step:check_orbax", formats=("orbax",), capabilities=("keras-layout",),
                    describe="a Keras 3 Orbax step directory"))
register(FormatSpec("orbax-run", "orbax", AT_DIRECTORY, orbax.run_directory, open="orbax.run:open_run",
                    capabilities=("series",), describe="a directory of Orbax steps"))
register(FormatSpec("hf-folder", "hf", AT_DIRECTORY, hf.weights_folder, open=None, redirect=True))
register(FormatSpec("file-series", "series", AT_DIRECTORY, _file_series, open="series:open_series",
                    capabilities=("series",), describe="a folder of Keras or PyTorch checkpoints with the epoch or step in their names"))
register(FormatSpec("tf-directory", "tf", AT_DIRECTORY, tf.checkpoint_directory, open="tf.resolve:open_directory",
                    capabilities=("series",),
                    describe="a checkpoint directory"))
register(FormatSpec("hdf5", "keras", AT_FILE, keras.hdf5_file, open="keras.h5:open_h5",
                    formats=(m.FORMAT_KERAS_H5, m.FORMAT_KERAS_WEIGHTS_H5), capabilities=("writable", "keras-layout"),
                    describe="a Keras .h5/.weights.h5/.keras file"))
register(FormatSpec("torch-zip", "torch", AT_FILE, torch.torch_zip, open="torch.reader:open_torch_zip",
                    check="torch.reader:check_torch", formats=(m.FORMAT_TORCH_ZIP,), capabilities=("stored-bytes",),
                    describe="a torch.save file"))
register(FormatSpec("npz", "npz", AT_FILE, _npz_file, open="npz:open_npz", check="npz:check_npz",
                    formats=(m.FORMAT_NPZ,), capabilities=("writable",), describe="a numpy .npz file"))
register(FormatSpec("zip", "keras", AT_FILE, keras.keras_zip, open="keras.zip:open_zip", check="keras.zip:check_zip",
                    formats=(m.FORMAT_KERAS_ZIP,), capabilities=("keras-layout",), label=m.FORMAT_KERAS_ZIP))
register(FormatSpec("hf-sharded", "hf", AT_FILE, hf.sharded_index, open="hf.sharded:open_hf_sharded",
                    check="hf.sharded:check_hf_sharded", describe="a Hugging Face weights folder/index"))
register(FormatSpec("torch-legacy", "torch", AT_FILE, torch.torch_legacy, open="torch.reader:open_torch_legacy",
                    check="torch.reader:check_torch", formats=(m.FORMAT_TORCH_LEGACY,)))
register(FormatSpec("keras-sharded", "keras", AT_FILE, keras.sharded_index, open="keras.h5:open_sharded",
                    label="hdf5"))
register(FormatSpec("tf-bundle", "tf", AT_FILE, tf.bundle_index_file, open="tf.bundle:open_bundle"))
register(FormatSpec("tf-v1-table", "tf", AT_FILE, tf.v1_table_file, open="tf.v1:open_v1", check="tf.v1:check_v1_file",
                    formats=(m.FORMAT_TF_V1,), member="TF_V1", capabilities=("tf-restorable",)))
register(FormatSpec("safetensors", "safetensors", AT_FILE, safetensors.safetensors_file,
                    open="safetensors.file:open_safetensors", check="safetensors.file:check_safetensors",
                    formats=(m.FORMAT_SAFETENSORS,), capabilities=("stored-bytes", "writable"),
                    describe="a .safetensors file"))
refusal(MISSING)(tf.refuse_missing_data_shard)
refusal(BEFORE_FILES)(tf.refuse_data_shard)
refusal(BEFORE_FILES)(tf.refuse_savedmodel_graph)
refusal(BEFORE_FILES)(tf.refuse_state_file)
refusal(AFTER_FILES)(tf.refuse_damaged_index)
refusal(AFTER_FILES)(tf.refuse_meta_graph)
refusal(AFTER_FILES)(keras.refuse_not_keras)
