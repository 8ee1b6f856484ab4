"""Bad inputs of the file-system kind (issue 11, ``io``): FIFOs and devices where a checkpoint
file is expected, huge sparse files, checkpoint directories whose state file is hostile or
garbage, duplicate spellings of one checkpoint, and leftovers of interrupted writes.

Every input is built for real: ``os.mkfifo``, symlinks to ``/dev/zero`` and ``/dev/urandom``,
sparse files made with ``truncate``, state files written as text. Before the fix each FIFO hung
every command forever and each device or huge file was read until MemoryError; the runner in
``test_hardening.py`` runs every command under a 10 s / 500 MiB limit.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import struct

from catalogue import KERAS, RUN, Case, _copy_prefix

ROOT = pathlib.Path(__file__).resolve().parents[2]
HUGE = 3 << 30  # bytes of the sparse files (nothing is allocated on disk)
TABLE_MAGIC = 0xDB4775248B80FB57  # ckptinspect.formats.tf.sstable.TABLE_MAGIC: an index's last 8 bytes
STATE_LINES = "".join(f'all_model_checkpoint_paths: "ckpt-{n}"\n' for n in (4, 6, 8))
TRANSPLANT_BUILDER_ERROR = "Error: --builder no_such_module:build: cannot import 'no_such_module'"


def _dir(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    return d


def _run_copy(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d, dirs_exist_ok=True)
    return d


def _sparse(path: pathlib.Path, size: int = HUGE, tail: bytes = b"") -> pathlib.Path:
    with open(path, "wb") as f:
        f.truncate(size - len(tail))
        f.seek(size - len(tail))
        f.write(tail)
    return path


# -- FIFOs where a file is expected ---------------------------------------------------------
def fifo_index_prefix(d: pathlib.Path) -> pathlib.Path:
    os.mkfifo(_dir(d) / "x.index")
    return d / "x"


def fifo_index_file(d: pathlib.Path) -> pathlib.Path:
    os.mkfifo(_dir(d) / "x.index")
    return d / "x.index"


def fifo_h5(d: pathlib.Path) -> pathlib.Path:
    os.mkfifo(_dir(d) / "model.h5")
    return d / "model.h5"


def fifo_keras(d: pathlib.Path) -> pathlib.Path:
    os.mkfifo(_dir(d) / "model.keras")
    return d / "model.keras"


def fifo_weights_json(d: pathlib.Path) -> pathlib.Path:
    os.mkfifo(_dir(d) / "model.weights.json")
    return d / "model.weights.json"


def fifo_data_shard(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)
    shard = pathlib.Path(f"{prefix}.data-00000-of-00001")
    shard.unlink()
    os.mkfifo(shard)
    return prefix


# -- devices where a file is expected -------------------------------------------------------
def zero_index_prefix(d: pathlib.Path) -> pathlib.Path:
    (_dir(d) / "z.index").symlink_to("/dev/zero")
    return d / "z"


def urandom_index_file(d: pathlib.Path) -> pathlib.Path:
    (_dir(d) / "u.index").symlink_to("/dev/urandom")
    return d / "u.index"


def zero_h5(d: pathlib.Path) -> pathlib.Path:
    (_dir(d) / "model.h5").symlink_to("/dev/zero")
    return d / "model.h5"


def urandom_keras(d: pathlib.Path) -> pathlib.Path:
    (_dir(d) / "model.keras").symlink_to("/dev/urandom")
    return d / "model.keras"


def zero_data_shard(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)
    shard = pathlib.Path(f"{prefix}.data-00000-of-00001")
    shard.unlink()
    shard.symlink_to("/dev/zero")
    return prefix


def huge_sparse_index(d: pathlib.Path) -> pathlib.Path:
    """A 3 GB sparse ``.index`` that ends in the table magic number, as a real index does."""
    _sparse(_dir(d) / "h.index", tail=struct.pack("<Q", TABLE_MAGIC))
    return d / "h"


# -- hostile or broken state files ----------------------------------------------------------
def state_fifo(d: pathlib.Path) -> pathlib.Path:
    _run_copy(d)
    (d / "checkpoint").unlink()
    os.mkfifo(d / "checkpoint")
    return d


def state_dev_zero(d: pathlib.Path) -> pathlib.Path:
    _run_copy(d)
    (d / "checkpoint").unlink()
    (d / "checkpoint").symlink_to("/dev/zero")
    return d


def state_huge(d: pathlib.Path) -> pathlib.Path:
    _run_copy(d)
    _sparse(d / "checkpoint")
    return d


def state_garbage_bytes(d: pathlib.Path) -> pathlib.Path:
    _run_copy(d)
    (d / "checkpoint").write_bytes(bytes(range(256)) * 4)
    return d


def state_garbage_text(d: pathlib.Path) -> pathlib.Path:
    """Text TensorFlow's parser rejects: tf.train.latest_checkpoint returns None here."""
    _run_copy(d)
    (d / "checkpoint").write_text('model_checkpoint_path: "ckpt-8"\nthis is not a CheckpointState\n' + STATE_LINES)
    return d


def state_names_passwd(d: pathlib.Path) -> pathlib.Path:
    _run_copy(d)
    (d / "checkpoint").write_text('model_checkpoint_path: "../../etc/passwd"\n' + STATE_LINES)
    return d


def state_names_dev_zero(d: pathlib.Path) -> pathlib.Path:
    _run_copy(d)
    (d / "checkpoint").write_text('model_checkpoint_path: "/dev/zero"\nall_model_checkpoint_paths: "/dev/zero"\n')
    return d


def state_names_fifo(d: pathlib.Path) -> pathlib.Path:
    _run_copy(d)
    os.mkfifo(d / "pipe")
    (d / "checkpoint").write_text(STATE_LINES + 'model_checkpoint_path: "pipe"\n')
    return d


def state_names_fifo_index(d: pathlib.Path) -> pathlib.Path:
    """The latest checkpoint's index is a FIFO: listing it must refuse, verify must go on."""
    _run_copy(d)
    os.mkfifo(d / "ckpt-10.index")
    (d / "checkpoint").write_text(STATE_LINES + 'all_model_checkpoint_paths: "ckpt-10"\nmodel_checkpoint_path: "ckpt-10"\n')
    return d


def state_names_huge_index(d: pathlib.Path) -> pathlib.Path:
    _run_copy(d)
    _sparse(d / "ckpt-10.index", tail=struct.pack("<Q", TABLE_MAGIC))
    (d / "checkpoint").write_text(STATE_LINES + 'all_model_checkpoint_paths: "ckpt-10"\nmodel_checkpoint_path: "ckpt-10"\n')
    return d


def state_names_huge_file(d: pathlib.Path) -> pathlib.Path:
    """The state file names a 3 GB file (no ``.index``): TensorFlow would take it for a V1 checkpoint."""
    _run_copy(d)
    _sparse(d / "big")
    (d / "checkpoint").write_text(STATE_LINES + 'model_checkpoint_path: "big"\n')
    return d


def retained_index_dev_zero(d: pathlib.Path) -> pathlib.Path:
    """An older retained checkpoint's index is a link to /dev/zero; the latest is fine."""
    _run_copy(d)
    (d / "ckpt-4.index").unlink()
    (d / "ckpt-4.index").symlink_to("/dev/zero")
    return d


# -- duplicates and leftovers ---------------------------------------------------------------
def absolute_state_relative_path(d: pathlib.Path) -> pathlib.Path:
    """A TF1 Saver writes absolute paths; the directory is given by a relative path (the
    runner's working directory is the repository root)."""
    _run_copy(d)
    (d / "checkpoint").write_text(
        f'model_checkpoint_path: "{d}/ckpt-8"\n' + "".join(f'all_model_checkpoint_paths: "{d}/ckpt-{n}"\n' for n in (4, 6, 8))
    )
    return pathlib.Path(os.path.relpath(d, ROOT))


def leftover_temporaries(d: pathlib.Path) -> pathlib.Path:
    """What a SIGKILLed extract leaves: a temporary file and a temporary prefix folder."""
    _run_copy(d)
    (d / ".ckptinspect-tmp-0123456789ab.model.weights.h5").write_bytes(b"\x89HDF partial")
    (d / ".ckptinspect-tmp-ba9876543210").mkdir()
    (d / ".ckptinspect-tmp-ba9876543210" / "ckpt.data-00000-of-00001").write_bytes(b"x" * 64)
    return d


def keras_file_in_fifo_directory(d: pathlib.Path) -> pathlib.Path:
    """A real .keras next to a FIFO: listing the good file must not touch the FIFO."""
    _dir(d)
    shutil.copy(KERAS / "model.keras", d / "model.keras")
    os.mkfifo(d / "model.keras.index")
    return d / "model.keras"


def tf1_fifo_data_shard(d: pathlib.Path) -> pathlib.Path:
    """A TF1 name-based checkpoint (listing reads the index alone) whose data shard is a FIFO:
    ls works; everything that reads values refuses before TensorFlow's reader opens the FIFO."""
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    v1 = tf.compat.v1
    with tf.Graph().as_default():
        v1.get_variable("w", initializer=np.arange(6, dtype=np.float32).reshape(2, 3))
        saver = v1.train.Saver()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            prefix = pathlib.Path(saver.save(sess, str(_dir(d) / "model.ckpt"), write_meta_graph=False))
    shard = pathlib.Path(f"{prefix}.data-00000-of-00001")
    shard.unlink()
    os.mkfifo(shard)
    return prefix


def fifo_v1_file(d: pathlib.Path) -> pathlib.Path:
    os.mkfifo(_dir(d) / "export-00000-of-00001")
    return d / "export-00000-of-00001"


def state_dangling_link(d: pathlib.Path) -> pathlib.Path:
    _run_copy(d)
    (d / "checkpoint").unlink()
    (d / "checkpoint").symlink_to(d / "no-such-state-file")
    return d


def _saved_model(path: pathlib.Path) -> None:
    import tensorflow as tf  # noqa: PLC0415

    module = tf.Module()
    module.w = tf.Variable([1.0, 2.0])
    tf.saved_model.save(module, str(path))


def saved_model_pb(d: pathlib.Path) -> pathlib.Path:
    _saved_model(d / "exported")
    return d / "exported" / "saved_model.pb"


def export_folder(d: pathlib.Path) -> pathlib.Path:
    """What TF Serving reads: timestamped SavedModel versions in one folder."""
    for stamp in ("1700000000", "1700000100", "1700000200"):
        _saved_model(d / "serving" / stamp)
    return d / "serving"


def keras_folder(d: pathlib.Path) -> pathlib.Path:
    for name in ("model.keras", "model.weights.h5"):
        shutil.copy(KERAS / name, _dir(d) / name)
    return d


def fifo_safetensors(d: pathlib.Path) -> pathlib.Path:
    os.mkfifo(_dir(d) / "model.safetensors")
    return d / "model.safetensors"


def fifo_torch(d: pathlib.Path) -> pathlib.Path:
    os.mkfifo(_dir(d) / "pytorch_model.bin")
    return d / "pytorch_model.bin"


def zero_safetensors(d: pathlib.Path) -> pathlib.Path:
    (_dir(d) / "model.safetensors").symlink_to("/dev/zero")
    return d / "model.safetensors"


def hf_index_names_fifo(d: pathlib.Path) -> pathlib.Path:
    """A Hugging Face sharded folder whose index names a FIFO as its shard."""
    os.mkfifo(_dir(d) / "model-00001-of-00001.safetensors")
    (d / "model.safetensors.index.json").write_text(
        '{"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}')
    return d


# -- expectations ---------------------------------------------------------------------------
ALL = ("ls", "ls-stats", "verify", "diff", "extract")
NOT_REGULAR = "not a regular file ({kind}); refusing to read"


def refused(path: str, kind: str, commands=ALL) -> dict[str, tuple[int, str]]:
    return {cmd: (2, f"Error: {path}: " + NOT_REGULAR.format(kind=kind)) for cmd in commands}


def _directory_warns(warning: str, verify_problem: str) -> dict[str, tuple]:
    """A directory whose state file is broken: ls lists the newest checkpoint on disk and warns;
    verify checks every checkpoint and reports the state file as a problem (exit 1)."""
    return {
        "ls": (0, "path:    {p}/ckpt-8", warning),
        "ls-stats": (0, "path:    {p}/ckpt-8", warning),
        "verify": (1, "verdict: INCONSISTENT … problem: " + verify_problem),
        "diff": (0, "all 26 variables equal"),
        "extract": (0, "model"),
        "transplant": (2, TRANSPLANT_BUILDER_ERROR),
    }


CASES = [
    Case("fifo-index-prefix", fifo_index_prefix, refused("{p}.index", "FIFO")),
    Case("fifo-index-file", fifo_index_file, refused("{p}", "FIFO")),
    Case("fifo-h5", fifo_h5, refused("{p}", "FIFO")),
    Case("fifo-keras", fifo_keras, refused("{p}", "FIFO")),
    Case("fifo-weights-json", fifo_weights_json, refused("{p}", "FIFO")),
    Case("fifo-data-shard", fifo_data_shard, refused("{p}.data-00000-of-00001", "FIFO")),
    Case("dev-zero-index-link", zero_index_prefix, refused("{p}.index", "character device")),
    Case("dev-urandom-index-link", urandom_index_file, refused("{p}", "character device")),
    Case("dev-zero-h5-link", zero_h5, refused("{p}", "character device")),
    Case("dev-urandom-keras-link", urandom_keras, refused("{p}", "character device")),
    Case("dev-zero-data-shard", zero_data_shard, refused("{p}.data-00000-of-00001", "character device")),
    Case("huge-sparse-index", huge_sparse_index, {
        cmd: (2, "Error: {p}.index: checkpoint index is 3221225472 bytes (3.0 GiB), more than the 256.0 MiB"
                 " a checkpoint index may take; refusing to read")
        for cmd in ALL
    }),
    Case("state-fifo", state_fifo, _directory_warns(
        "warning: {p}/checkpoint: not a regular file (FIFO); refusing to read; the directory is read by"
        " scanning *.index instead",
        "{p}/checkpoint: not a regular file (FIFO)")),
    Case("state-dev-zero-link", state_dev_zero, _directory_warns(
        "warning: {p}/checkpoint: not a regular file (character device); refusing to read",
        "{p}/checkpoint: not a regular file (character device)")),
    Case("state-huge", state_huge, _directory_warns(
        "warning: {p}/checkpoint: checkpoint state file is 3221225472 bytes (3.0 GiB), more than the 1.0 MiB",
        "{p}/checkpoint: checkpoint state file is 3221225472 bytes")),
    Case("state-garbage-bytes", state_garbage_bytes, _directory_warns(
        "warning: {p}/checkpoint: not a checkpoint state file (not UTF-8 text); tf.train.latest_checkpoint"
        " finds nothing here",
        "{p}/checkpoint: not a checkpoint state file (not UTF-8 text)")),
    Case("state-garbage-text", state_garbage_text, _directory_warns(
        "warning: {p}/checkpoint: not a valid checkpoint state file: line 2 'this is not a CheckpointState'"
        " is not a CheckpointState field; tf.train.latest_checkpoint finds nothing here",
        "{p}/checkpoint: not a valid checkpoint state file: line 2")),
    Case("state-names-etc-passwd", state_names_passwd, _directory_warns(
        "warning: {p}/checkpoint: names '../../etc/passwd', outside the directory {p}; not read as a checkpoint",
        "{p}/checkpoint: names '../../etc/passwd', outside the directory {p}; not read as a checkpoint")),
    Case("state-names-dev-zero", state_names_dev_zero, _directory_warns(
        "warning: {p}/checkpoint: names '/dev/zero', outside the directory {p}; not read as a checkpoint",
        "{p}/checkpoint: names '/dev/zero', outside the directory {p}")),
    Case("state-names-fifo", state_names_fifo, _directory_warns(
        "warning: {p}/checkpoint: names 'pipe', which is not a regular file; not read as a checkpoint",
        "{p}/checkpoint: names 'pipe', which is not a regular file")),
    Case("state-names-fifo-index", state_names_fifo_index, {
        **refused("{p}/ckpt-10.index", "FIFO", ("ls", "ls-stats", "diff", "extract")),
        "verify": (1, "DAMAGED: 1 damaged, 0 missing of 4 checkpoints … {p}/ckpt-10  -       10        damaged … ckpt-10.index: not a regular file (FIFO)"),
    }),
    Case("state-names-huge-index", state_names_huge_index, {
        cmd: (2, "Error: {p}/ckpt-10.index: checkpoint index is 3221225472 bytes (3.0 GiB)")
        for cmd in ("ls", "ls-stats", "diff", "extract")
    } | {"verify": (1, "DAMAGED: 1 damaged, 0 missing of 4 checkpoints … checkpoint index is 3221225472 bytes")}),
    Case("state-names-huge-file", state_names_huge_file, {
        **{cmd: (2, "Error: {p}/big: not a valid V1 checkpoint: not an sstable (bad magic number)")
           for cmd in ("ls", "ls-stats", "diff", "extract")},
        "verify": (1, "DAMAGED: 1 damaged, 0 missing of 4 checkpoints … {p}/big … damaged … not a checkpoint"),
    }),
    Case("retained-index-dev-zero", retained_index_dev_zero, {
        "ls": (0, "path:    {p}/ckpt-8 … {p}/ckpt-4"),
        "ls-stats": (0, "path:    {p}/ckpt-8"),
        "verify": (1, "DAMAGED: 1 damaged, 0 missing of 3 checkpoints … {p}/ckpt-4.index: not a regular file (character device)"),
        "diff": (0, "all 26 variables equal"),
        "extract": (0, "model"),
        "transplant": (2, TRANSPLANT_BUILDER_ERROR),
    }),
    Case("absolute-state-relative-path", absolute_state_relative_path, {
        "ls": (0, "in state file"),
        "verify": (0, "verdict: INTACT: 3 of 3 checkpoints whole, 81 tensors"),
        "diff": (0, "all 26 variables equal"),
    }),
    Case("leftover-temporaries", leftover_temporaries, {
        "ls": (0, "path:    {p}/ckpt-8",
               "warning: {p}/.ckptinspect-tmp-0123456789ab.model.weights.h5: left over from an interrupted"
               " ckptinspect write (safe to delete) … warning: {p}/.ckptinspect-tmp-ba9876543210: left over"),
        "verify": (0, "verdict: INTACT: 3 of 3 … note:    {p}/.ckptinspect-tmp-0123456789ab.model.weights.h5: left over"
                      " from an interrupted ckptinspect write (safe to delete)"),
    }),
    Case("tf1-fifo-data-shard", tf1_fifo_data_shard, {
        "ls": (0, "w  "),
        **refused("{p}.data-00000-of-00001", "FIFO", ("ls-stats", "verify", "extract")),
        "diff": (1, "26 added, 1 removed"),  # no name in common with the fixture run: nothing is read
        "transplant": (2, TRANSPLANT_BUILDER_ERROR),
    }),
    Case("fifo-v1-file", fifo_v1_file, refused("{p}", "FIFO")),
    Case("state-dangling-link", state_dangling_link, _directory_warns(
        "warning: {p}/checkpoint: no such file; the directory is read by scanning *.index instead",
        "{p}/checkpoint: no such file")),
    Case("saved-model-pb", saved_model_pb, {
        cmd: (2, "Error: {p}: is a SavedModel's graph, not a checkpoint; pass its directory {d}/exported"
                 " (its variables are in {d}/exported/variables/variables)")
        for cmd in ALL
    }),
    Case("export-folder", export_folder, {
        cmd: (2, "Error: {p}: an export directory holding 3 SavedModels, not a checkpoint; pass one of them:"
                 " {p}/1700000200, {p}/1700000100, {p}/1700000000")
        for cmd in ALL
    }),
    Case("keras-folder", keras_folder, {
        cmd: (2, "Error: {p}: holds Keras files with no epoch or step in their names, not a series of checkpoints; pass one of them:"
                 " {p}/model.keras, {p}/model.weights.h5")
        for cmd in ALL
    }),
    Case("fifo-safetensors", fifo_safetensors, refused("{p}", "FIFO")),
    Case("fifo-torch-bin", fifo_torch, refused("{p}", "FIFO")),
    Case("dev-zero-safetensors-link", zero_safetensors, refused("{p}", "character device")),
    Case("hf-index-names-fifo", hf_index_names_fifo, refused("{p}/model-00001-of-00001.safetensors", "FIFO")),
    Case("keras-next-to-fifo", keras_file_in_fifo_directory, {
        "ls": (0, "format:    keras-zip"),
        "verify": (0, "INTACT"),
    }),
]
