"""Bad-input catalogue, Keras and npz area: HDF5 datasets that are not numbers, datasets
declared but never written, ``.keras`` archives with duplicate members or pickled npz weights,
deflated members, and ``.npz`` files (good, pickled, duplicated, damaged).

Every input is built for real: h5py writes the HDF5 files, zipfile the archives, Keras itself
the npz-weights archive, numpy the npz files, ``ckptinspect extract`` the good npz.
"""

from __future__ import annotations

import io
import pathlib
import shutil
import warnings
import zipfile

import h5py
import numpy as np

from catalogue import KERAS, RUN, Case

# A Keras 3 weights file: positional datasets under ``layers/<layer>/vars/<i>``.
WEIGHTS = KERAS / "model.weights.h5"
LEGACY = KERAS / "model.h5"
ARCHIVE = KERAS / "model.keras"
UNALLOCATED_ELEMENTS = 1 << 30  # float32: 4 GiB declared, nothing written
UNALLOCATED_KEY = "layers/big/vars/0"
LEGACY_UNALLOCATED_KEY = "model_weights/head/head/kernel"


# -- HDF5: datasets that are not numbers ------------------------------------------------------
def _weights_with(d: pathlib.Path, add) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.weights.h5"
    shutil.copy(WEIGHTS, path)
    with h5py.File(path, "a") as f:
        add(f)
    return path


def h5_object_references(d: pathlib.Path) -> pathlib.Path:
    """``layers/extra/vars/0``: object references to two weights and one null reference."""

    def add(f):
        refs = [f["layers/dense/vars/0"].ref, f["layers/dense/vars/1"].ref, h5py.Reference()]
        f.create_dataset("layers/extra/vars/0", data=np.array(refs, dtype=h5py.ref_dtype))

    return _weights_with(d, add)


def h5_region_references(d: pathlib.Path) -> pathlib.Path:
    def add(f):
        target = f["layers/dense/vars/0"]
        f.create_dataset("layers/extra/vars/0", data=np.array([target.regionref[0:2, 1:3]], dtype=h5py.regionref_dtype))

    return _weights_with(d, add)


def h5_compound(d: pathlib.Path) -> pathlib.Path:
    def add(f):
        record = np.dtype([("step", "<i8"), ("loss", "<f4")])
        f.create_dataset("layers/extra/vars/0", data=np.array([(1, 0.5), (2, np.nan)], dtype=record))

    return _weights_with(d, add)


def h5_opaque(d: pathlib.Path) -> pathlib.Path:
    def add(f):
        f.create_dataset("layers/extra/vars/0", data=np.array([b"\x00\x01\x02\x03", b"\xff\xfe\xfd\xfc"], dtype="V4"))

    return _weights_with(d, add)


def h5_vlen(d: pathlib.Path) -> pathlib.Path:
    def add(f):
        ds = f.create_dataset("layers/extra/vars/0", (3,), dtype=h5py.vlen_dtype(np.float32))
        ds[0] = np.arange(3, dtype=np.float32)
        ds[1] = np.array([np.nan], dtype=np.float32)
        ds[2] = np.zeros(0, dtype=np.float32)

    return _weights_with(d, add)


# -- HDF5: declared but never written ---------------------------------------------------------
def h5_unallocated_chunked(d: pathlib.Path) -> pathlib.Path:
    """A 38 KB file declaring a 4 GiB chunked dataset of which no chunk was ever written."""

    def add(f):
        f.create_dataset(UNALLOCATED_KEY, shape=(UNALLOCATED_ELEMENTS,), dtype="f4", chunks=(1 << 20,))

    return _weights_with(d, add)


def h5_unallocated_contiguous_legacy(d: pathlib.Path) -> pathlib.Path:
    """A legacy full-model ``.h5`` whose ``head/kernel`` was created and never written (what a
    writer killed between ``create_dataset`` and the assignment leaves), fill value 0.5."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.h5"
    shutil.copy(LEGACY, path)
    with h5py.File(path, "a") as f:
        shape = f[LEGACY_UNALLOCATED_KEY].shape
        del f[LEGACY_UNALLOCATED_KEY]
        f.create_dataset(LEGACY_UNALLOCATED_KEY, shape=shape, dtype="f4", fillvalue=0.5)
    return path


# -- .keras archives ---------------------------------------------------------------------------
def _repack(src: pathlib.Path, dst: pathlib.Path, extra: list[tuple[str, bytes]] = (),
            compression: int = zipfile.ZIP_STORED, replace: dict[str, bytes] | None = None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about duplicate names: that is the point
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
            for info in zin.infolist():
                data = (replace or {}).get(info.filename, zin.read(info))
                zout.writestr(info.filename, data, compress_type=compression)
            for name, data in extra:
                zout.writestr(name, data, compress_type=compression)


def keras_duplicate_config(d: pathlib.Path) -> pathlib.Path:
    """A second ``config.json`` after the real one: a scanner reading the first sees a clean
    model, a loader taking the last gets another."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.keras"
    _repack(ARCHIVE, path, [("config.json", b'{"class_name": "Lambda", "config": {"function": "evil"}}')])
    return path


def keras_duplicate_weights(d: pathlib.Path) -> pathlib.Path:
    """Two ``model.weights.h5`` members: the real one, then one with other values."""
    d.mkdir(parents=True, exist_ok=True)
    other = d / "other.weights.h5"
    shutil.copy(WEIGHTS, other)
    with h5py.File(other, "a") as f:
        f["layers/dense/vars/0"][...] = 0
    path = d / "model.keras"
    _repack(ARCHIVE, path, [("model.weights.h5", other.read_bytes())])
    other.unlink()
    return path


def keras_npz_weights(d: pathlib.Path) -> pathlib.Path:
    """A real Keras 3 archive saved with ``weights_format="npz"``: pickled object arrays."""
    import keras  # noqa: PLC0415 - heavy, only for this input
    from keras.src.saving import saving_lib  # noqa: PLC0415 - the only API taking weights_format

    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.keras"
    inp = keras.Input((3,))
    model = keras.Model(inp, keras.layers.Dense(2, name="dense")(inp))
    saving_lib.save_model(model, str(path), weights_format="npz")
    return path


def keras_deflated_unallocated(d: pathlib.Path) -> pathlib.Path:
    """A ``.keras`` archive, DEFLATE-compressed, whose weights declare 4 GiB never written."""
    d.mkdir(parents=True, exist_ok=True)
    weights = h5_unallocated_chunked(d / "build")
    path = d / "model.keras"
    _repack(ARCHIVE, path, compression=zipfile.ZIP_DEFLATED, replace={"model.weights.h5": weights.read_bytes()})
    shutil.rmtree(d / "build")
    return path


# -- .npz ------------------------------------------------------------------------------------
def npz_from_extract(d: pathlib.Path) -> pathlib.Path:
    """What ``ckptinspect extract RUN -o weights.npz`` writes (merely unusual: everything works)."""
    import ckptinspect  # noqa: PLC0415

    d.mkdir(parents=True, exist_ok=True)
    path = d / "weights.npz"
    ckptinspect.extract(str(RUN), str(path))
    return path


def npz_pickled(d: pathlib.Path) -> pathlib.Path:
    """``np.savez`` with an object array (stored pickled) beside a plain one."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "weights.npz"
    payload = np.empty(1, dtype=object)
    payload[0] = {"layer": "dense", "kernel": [1.0, 2.0]}
    np.savez(path, kernel=np.ones((2, 2), np.float32), state=payload)
    return path


def npz_duplicate_member(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / "weights.npz"
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros(3, np.float32))
    np.savez(path, kernel=np.ones(3, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(path, "a") as zf:
            zf.writestr("kernel.npy", buf.getvalue())
    return path


def npz_header_lies(d: pathlib.Path) -> pathlib.Path:
    """A member whose ``.npy`` header declares 4 GiB of float32 but holds 16 bytes of data
    (numpy would allocate the 4 GiB before finding out)."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "weights.npz"
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        member, {"descr": "<f4", "fortran_order": False, "shape": (UNALLOCATED_ELEMENTS,)})
    member.write(np.ones(4, np.float32).tobytes())
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("kernel.npy", member.getvalue())
    return path


def npz_bad_crc(d: pathlib.Path) -> pathlib.Path:
    """One flipped bit in the data of a stored member (its CRC-32 no longer matches)."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "weights.npz"
    np.savez(path, kernel=np.arange(16, dtype=np.float32))
    raw = bytearray(path.read_bytes())
    at = raw.find(np.arange(16, dtype=np.float32).tobytes())
    raw[at + 5] ^= 0x01
    path.write_bytes(bytes(raw))
    return path


# -- the cases ---------------------------------------------------------------------------------
# {p}: the path given; {d}: the case directory; " … " separates parts that must all appear.
BUILDER_ERROR = "Error: --builder no_such_module:build: cannot import 'no_such_module'"
# extract to a TF prefix: a name-based bundle from any source (what it cannot hold is refused).
TF_OUTPUT_CANNOT_HOLD = "Error: {{p}}: 'extra/vars/0' has dtype {dtype}, which a TF bundle cannot hold"
TF_OUTPUT_WRITTEN = (0, "read back bit-identical … name-based TF bundle")


def _opens(dtype: str, **extra: tuple[int, str]) -> dict[str, tuple[int, str]]:
    """A weights file with one extra dataset of a non-numeric ``dtype``: everything but writing works."""
    return {
        "ls": (0, f"extra/vars/0 … {dtype}"),
        "ls-stats": (0, f"extra/vars/0 … {dtype}"),
        "verify": (0, "verdict: INTACT: 1 of 1 checkpoint whole, 25 tensors"),
        "diff": (1, "extra/vars/0 … removed"),
        "extract": (2, TF_OUTPUT_CANNOT_HOLD.format(dtype=dtype)),
        "transplant": (2, BUILDER_ERROR),
        **extra,
    }


def _refused(message: str, verify: tuple[int, str] | None = None) -> dict[str, tuple[int, str]]:
    out = {cmd: (2, message) for cmd in ("ls", "ls-stats", "verify", "diff", "extract", "transplant")}
    if verify is not None:
        out["verify"] = verify
    return out


DUPLICATE = "archive member '{name}' appears 2 times (readers disagree on which copy counts: a known way to hide content)"
UNALLOCATED_WARNING = "warning: … 1 dataset declared but unallocated (never written, no values): "
UNALLOCATED_BIG = ("dataset 'layers/big/vars/0' is declared but unallocated: shape [1073741824] float32 (4.0 GiB)"
                   " was never written, it would read as its fill value 0.0")

CASES = [
    Case("h5-object-references", h5_object_references, _opens("reference")),
    Case("h5-region-references", h5_region_references, _opens("region-reference")),
    Case("h5-compound", h5_compound, _opens("compound")),
    Case("h5-opaque", h5_opaque, _opens("opaque")),
    Case("h5-vlen", h5_vlen, _opens("vlen-float32")),
    Case("h5-unallocated-chunked-4gib", h5_unallocated_chunked, {
        "ls": (0, UNALLOCATED_WARNING + UNALLOCATED_KEY + " … big/vars/0 … [1073741824] … 4.0 GiB"),
        "ls-stats": (0, UNALLOCATED_WARNING + UNALLOCATED_KEY),
        "verify": (1, "verdict: DAMAGED … first:   big/vars/0 in {p}: … " + UNALLOCATED_BIG + " … unallocated"),
        "diff": (1, "big/vars/0 … removed"),
        "extract": (2, "Error: {p}: " + UNALLOCATED_BIG),
        "transplant": (2, BUILDER_ERROR),
    }),
    Case("h5-unallocated-legacy-kernel", h5_unallocated_contiguous_legacy, {
        "ls": (0, UNALLOCATED_WARNING + LEGACY_UNALLOCATED_KEY),
        "ls-stats": (0, UNALLOCATED_WARNING + LEGACY_UNALLOCATED_KEY),
        "verify": (1, "verdict: DAMAGED … first:   head/kernel in {p}: … dataset 'model_weights/head/head/kernel' is"
                      " declared but unallocated: shape [16, 4] float32 (256 bytes) was never written, it would read"
                      " as its fill value 0.5"),
        # Compared as what Keras would load: every element 0.5.
        "diff": (1, "head/kernel … changed … 64/64"),
        "extract": (2, "Error: {p}: dataset 'model_weights/head/head/kernel' is declared but unallocated"),
        "transplant": (2, BUILDER_ERROR),
    }),
    Case("keras-duplicate-config", keras_duplicate_config, _refused(
        "Error: {p}: " + DUPLICATE.format(name="config.json") + "; refusing",
        verify=(1, "verdict: DAMAGED … " + DUPLICATE.format(name="config.json")))),
    Case("keras-duplicate-weights", keras_duplicate_weights, _refused(
        "Error: {p}: " + DUPLICATE.format(name="model.weights.h5") + "; refusing",
        verify=(1, "verdict: DAMAGED … " + DUPLICATE.format(name="model.weights.h5")))),
    Case("keras-npz-weights-pickled", keras_npz_weights, _refused(
        "Error: {p}: weights are stored as model.weights.npz, whose member '__root__.npy' holds pickled Python"
        " objects (dtype object); ckptinspect never loads pickled objects (unpickling can run code)")),
    Case("keras-deflated-unallocated", keras_deflated_unallocated, {
        "ls": (0, UNALLOCATED_WARNING + UNALLOCATED_KEY),
        "ls-stats": (0, UNALLOCATED_WARNING + UNALLOCATED_KEY),
        "verify": (1, "verdict: DAMAGED … {p}/model.weights.h5: " + UNALLOCATED_BIG),
        "diff": (1, "big/vars/0 … removed"),
        "extract": (2, "Error: {p}/model.weights.h5: " + UNALLOCATED_BIG),
        "transplant": (2, BUILDER_ERROR),
    }),
    Case("npz-from-extract", npz_from_extract, {
        "ls": (0, "format:  npz … encoder/enc_dense/kernel … [8,16] … model"),
        "ls-stats": (0, "format:  npz … encoder/enc_dense/kernel"),
        "verify": (0, "verdict: INTACT: 1 of 1 checkpoint whole, 10 tensors"),
        "diff": (1, "added"),  # the npz holds the model's weights, RUN its optimizer state too
        "extract": TF_OUTPUT_WRITTEN,
        "transplant": (2, BUILDER_ERROR),
    }),
    Case("npz-pickled-object-array", npz_pickled, _refused(
        "Error: {p}: array 'state' holds pickled Python objects (dtype object); ckptinspect never loads pickled objects")),
    Case("npz-duplicate-member", npz_duplicate_member, _refused(
        "Error: {p}: archive member 'kernel.npy' appears 2 times (readers disagree on which copy counts",
        verify=(1, "verdict: DAMAGED … member 'kernel.npy' appears 2 times"))),
    Case("npz-header-declares-4gib", npz_header_lies, _refused(
        "Error: {p}: array 'kernel' declares shape [1073741824] float32 (4294967296 bytes) but its member holds 16"
        " bytes of data (truncated or damaged)",
        verify=(1, "verdict: DAMAGED … array 'kernel' declares shape [1073741824] float32"))),
    Case("npz-bad-crc", npz_bad_crc, {
        "ls": (0, "kernel … [16] … float32"),
        "ls-stats": (2, "Error: {p}: cannot read array 'kernel': Bad CRC-32 for file 'kernel.npy'"),
        "verify": (1, "verdict: DAMAGED … first:   kernel.npy in {p}: archive member does not read: Bad CRC-32"),
        "diff": (1, "kernel"),
        "extract": (2, "Error: {p}: cannot read array 'kernel': Bad CRC-32 for file 'kernel.npy'"),
        "transplant": (2, BUILDER_ERROR),
    }),
]
