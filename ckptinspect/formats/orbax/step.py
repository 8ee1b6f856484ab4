"""The Orbax reader: one step directory of a Keras 3 ``OrbaxCheckpoint`` run.

Names, tree, sharding and times come from the step's plain JSON files (:mod:`.layout`); each
array's shape, dtype and chunking from its ``zarr.json`` inside the OCDBT database, read by our
own OCDBT reader (:mod:`.ocdbt`: the manifest and B+tree nodes, zstd through ``zstandard``), and
its values from tensorstore's ``zarr3`` driver over the ``ocdbt`` key-value store (the reader
Orbax itself uses). Opening a step (``ls``) never imports tensorstore: it is imported when a
value is first read (``ls --stats``, ``diff``, ``verify``...). JAX and orbax are never imported;
the ``ckptinspect[orbax]`` extra brings tensorstore and zstandard, and the absence of either is
one clear error when it is needed.

Which process wrote which chunks (the shards column) comes from each process' own database
(``ocdbt.process_N``): its keys are listed, never its values (``array_metadatas/process_N`` is no
substitute: every process lists every array there, also the replicated ones only process 0
writes). The optimizer's iteration count (the step) is a scalar chunk decoded from its database
entry where it is stored as Orbax writes it (``sharding_indexed``: ``bytes`` then ``zstd``, the
index checked with its crc32c), else read through tensorstore. Values stream chunk row by chunk
row (:meth:`OrbaxSource.iter_blocks`).

What cannot be proven: OCDBT checksums its manifests and tree nodes and the zarr shard index
carries a crc32c, but the chunk data (zstd-compressed, ``checksum: false``) has none: a flipped
bit inside a chunk may still decode to wrong values.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import math
import os
import stat
import sys
import threading
from typing import TYPE_CHECKING, Any, Iterator

from ... import model as m
from ...errors import CorruptCheckpointError, NotACheckpointError, UnsafeFileError, UsageError, one_line
from .. import _fs
from .._readcheck import Check
from .._step import training_step
from .ocdbt import Database, ValueRef, open_database, zstd_decompress
from .layout import (
    COMMIT_MARKER,
    MANIFEST,
    PROCESS_PREFIX,
    TMP_SUFFIX,
    ArrayEntry,
    StepLayout,
    read_step_layout,
    readable_name,
    role_of,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "FORMAT_ORBAX",
    "INSTALL_HINT",
    "NO_CHECKSUM_NOTE",
    "open_orbax",
    "check_orbax",
    "step_candidates",
    "OrbaxSource",
    "tensorstore",
]

FORMAT_ORBAX = "orbax"
INSTALL_HINT = "pip install 'ckptinspect[orbax]'"
NO_CHECKSUM_NOTE = (
    "OCDBT checksums its manifests and tree nodes and each zarr shard index, but not the chunk data:"
    " a flipped bit inside a compressed chunk may still decode"
)
ZARR_JSON = "zarr.json"
MAX_ZARR_JSON_BYTES = 1 << 20
MAX_FILES = 1_000_000  # files walked in one step directory
MAX_CHUNK_BYTES = 1 << 31  # one decoded chunk (tensorstore decodes chunks whole)
MAX_DIMS = 64
INT64_MAX = (1 << 63) - 1
CACHE_BYTES = 32 << 20
REMOTE_WHOLE_CHUNK_BYTES = 1 << 20  # a remote chunk this small is read whole (its index and frame in one read)
REMOTE_READ_BYTES = 1 << 20  # a remote chunk's frame is read this much at a time (then streamed, read ahead)
CONCURRENT_CHUNK_BYTES = 16 << 20  # tensorstore's chunks that two concurrent reads may decode at once
ITERATION_NAMES = ("iteration", "iterations")
# zarr v3 data types -> ckptinspect dtype names (the same spelling, the ones we read).
ZARR_DTYPES = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "float16": "float16", "float32": "float32",
    "float64": "float64", "bfloat16": "bfloat16", "complex64": "complex64", "complex128": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}


def tensorstore():
    """The tensorstore module, or one clear error saying how to install it."""
    try:
        import tensorstore as ts  # noqa: PLC0415 - the [orbax] extra, loaded for Orbax checkpoints only
    except ImportError:
        raise UsageError(f"reading Orbax checkpoints needs tensorstore: {INSTALL_HINT}") from None
    return ts


def _file_url(path: str) -> str:
    return "file://" + os.path.abspath(path).rstrip("/") + "/"


def _kvstore_base(path: str) -> Any:
    """tensorstore's key-value store for a database folder: ``file://`` for a local one; its own
    ``s3`` / ``gcs`` drivers for a remote one, the endpoint, region and credentials from the
    standard environment (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, ``AWS_REGION``/
    ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``...; gcs: its own defaults)."""
    if not _fs.is_remote(path):
        return _file_url(path)
    scheme, _, rest = path.partition("://")
    bucket, _, key = rest.partition("/")
    key = key.strip("/") + "/" if key.strip("/") else ""
    scheme = scheme.lower()
    if scheme in ("s3", "s3a"):
        spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": key}
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            spec["endpoint"] = endpoint
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            spec["aws_region"] = region
        if os.environ.get("AWS_ACCESS_KEY_ID") and not os.environ.get("AWS_PROFILE"):
            spec["aws_credentials"] = {"type": "environment"}  # (the default chain also tries ~/.aws, noisily)
        return spec
    if scheme in ("gs", "gcs"):
        return {"driver": "gcs", "bucket": bucket, "path": key}
    raise UsageError(f"{path}: this Orbax array is read through tensorstore, which reads s3:// and gs:// only")


def _message(e: BaseException) -> str:
    """tensorstore's error in one line, without the spec it appends (``[tensorstore_spec=...]``:
    the endpoint, among others) and without the environment's endpoints or secrets."""
    text = one_line(e)
    cut = text.find(" [tensorstore_spec=")
    return _fs.remote_message(text[:cut] if cut > 0 else text)


def _iso(nsecs: Any) -> str | None:
    if not isinstance(nsecs, int) or isinstance(nsecs, bool) or not 0 < nsecs < (1 << 63):
        return None
    t = datetime.datetime.fromtimestamp(nsecs / 1e9, tz=datetime.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def step_of_name(path: str) -> int | None:
    """The step an Orbax step directory's name carries (``12``, ``12.orbax-checkpoint-tmp``)."""
    name = os.path.basename(os.path.normpath(path))
    name = name[: name.index(TMP_SUFFIX)] if TMP_SUFFIX in name else name
    return int(name) if name.isdigit() and len(name) < 20 else None


def step_candidates(iterations: tuple[str, int] | None) -> dict[str, int]:
    """Every step-like number a step's variables record (as the TF family's
    ``step_candidates``): the optimizer's iterations (``optimizer:<key>``, as the Keras family's
    ``counter_step`` names it). The directory's name (the number Orbax saved it under: the batch
    count, or the epoch with ``save_freq="epoch"``) is the checkpoint's ``number``, not a
    candidate (the step rule, :mod:`ckptinspect.formats._step`)."""
    return {f"optimizer:{iterations[0]}": iterations[1]} if iterations is not None else {}


# -- the files of a step ---------------------------------------------------------------------------
def _walk_files(step: str) -> list[str]:
    """Every file under the step directory, refusing special files (a FIFO or a link to a device
    would block or never end a read in tensorstore) and links leaving the directory."""
    if _fs.is_remote(step):  # one listing; no links or special files on an object store
        found = _fs.walk_remote(step, MAX_FILES)
        if found is None:
            raise UnsafeFileError(f"{step}: more than {MAX_FILES} files; refusing")
        return [p for p, _ in found]
    files: list[str] = []
    root = os.path.realpath(step)
    for dirpath, dirnames, filenames in os.walk(step, followlinks=False):
        for d in list(dirnames):
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                raise UnsafeFileError(f"{full}: a symbolic link to a folder inside an Orbax checkpoint; refusing")
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError:
                raise CorruptCheckpointError(f"{full}: cannot be read (a dangling link?)") from None
            if not stat.S_ISREG(st.st_mode):
                _fs.check_regular(full)  # names the kind of file and refuses it
            if os.path.islink(full) and not os.path.realpath(full).startswith(root + os.sep):
                raise UnsafeFileError(f"{full}: a symbolic link leaving the checkpoint; refusing")
            files.append(full)
            if len(files) > MAX_FILES:
                raise UnsafeFileError(f"{step}: more than {MAX_FILES} files; refusing")
    return sorted(files)


def _small_files(step: str, files: list[str]) -> list[str]:
    """The plain files opening a step reads whole: its metadata JSON and the databases' manifests."""
    names = {_fs.join(step, n) for n in ("_CHECKPOINT_METADATA", "pytree/_METADATA", "pytree/_sharding",
                                        "model_config/_strings.json", "pytree/" + MANIFEST)}
    manifests = [f for f in files if f.endswith("/" + MANIFEST) and f.startswith(_fs.join(step, "pytree", PROCESS_PREFIX))]
    return [f for f in files if f in names] + manifests


def _shape_dtype(key: str, raw: bytes, where: str) -> tuple[tuple[int, ...], str, tuple[int, ...], dict[str, Any]]:
    """Shape, dtype, chunk shape and the metadata itself from an array's ``zarr.json``, checked."""
    if len(raw) > MAX_ZARR_JSON_BYTES:
        raise UnsafeFileError(f"{where}: {key}/{ZARR_JSON} is {len(raw)} bytes; refusing")
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):
        raise CorruptCheckpointError(f"{where}: {key}/{ZARR_JSON} is not valid JSON") from None
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"{where}: {key}/{ZARR_JSON} is not a JSON object")
    shape = meta.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= INT64_MAX for d in shape):
        raise CorruptCheckpointError(f"{where}: {key} declares shape {str(shape)[:80]}, not a list of sizes")
    dtype = meta.get("data_type")
    if not isinstance(dtype, str):
        raise CorruptCheckpointError(f"{where}: {key} declares no data type")
    name = ZARR_DTYPES.get(dtype, dtype[:40])
    item = m.ITEMSIZE.get(name, 1)
    if math.prod(shape) * item > INT64_MAX:
        raise UnsafeFileError(f"{where}: {key} declares shape {m.format_shape(shape)[:120]}, more bytes than any file holds; refusing")
    chunk = _chunk_shape(meta) or tuple(shape)
    if len(chunk) != len(shape) or any(c <= 0 for c in chunk) and shape:
        raise CorruptCheckpointError(f"{where}: {key} declares chunks {list(chunk)} for shape {list(shape)}")
    if math.prod(min(c, s) for c, s in zip(chunk, shape)) * item > MAX_CHUNK_BYTES:
        raise UnsafeFileError(f"{where}: {key} declares chunks of {list(chunk)} elements; refusing")
    return tuple(shape), name, tuple(chunk), meta


def _chunk_shape(meta: dict[str, Any]) -> tuple[int, ...] | None:
    """The chunks tensorstore decodes: the sharding codec's inner chunks, else the chunk grid's."""
    grid = meta.get("chunk_grid")
    outer = None
    if isinstance(grid, dict) and isinstance(grid.get("configuration"), dict):
        cs = grid["configuration"].get("chunk_shape")
        if isinstance(cs, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in cs):
            outer = tuple(cs)
    for codec in meta.get("codecs") or ():
        if isinstance(codec, dict) and codec.get("name") == "sharding_indexed":
            conf = codec.get("configuration")
            cs = conf.get("chunk_shape") if isinstance(conf, dict) else None
            if isinstance(cs, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in cs):
                return tuple(cs)
    return outer


class _Array:
    """What the source knows of one array: its tensorstore key and declared chunking, and for an
    array stored as whole rows of chunks (:func:`_row_chunks`) where each chunk's zstd frame is."""

    __slots__ = ("key", "shape", "dtype", "chunk", "rows")

    def __init__(self, key: str, shape: tuple[int, ...], dtype: str, chunk: tuple[int, ...],
                 rows: list[ValueRef | None] | None = None):
        self.key, self.shape, self.dtype, self.chunk, self.rows = key, shape, dtype, chunk, rows


def _row_chunks(meta: dict[str, Any], shape: tuple[int, ...], key: str, refs: dict[bytes, ValueRef]) -> list[ValueRef | None] | None:
    """The stored value of each chunk of an array chunked along its first axis only (every chunk
    holds whole rows: what Orbax writes for an array on one device or split on its first axis),
    stored as Orbax stores it (``sharding_indexed`` with one inner chunk, ``bytes`` little-endian
    then ``zstd``, the index ``bytes`` + ``crc32c`` at the end, the default chunk keys): those are
    streamed (:meth:`OrbaxSource.iter_blocks`). None for any other layout (tensorstore reads it)."""
    codecs = meta.get("codecs")
    grid = meta.get("chunk_grid")
    if not isinstance(codecs, list) or len(codecs) != 1 or not isinstance(grid, dict):
        return None
    name, conf = _codec(codecs[0])
    outer = _chunk_shape({"chunk_grid": grid})
    inner = conf.get("chunk_shape")
    index = [_codec(c) for c in conf.get("index_codecs") or ()]
    inner_codecs = [_codec(c) for c in conf.get("codecs") or ()]
    key_encoding = meta.get("chunk_key_encoding")
    if (name != "sharding_indexed" or outer is None or list(outer) != inner or tuple(outer[1:]) != shape[1:]
            or conf.get("index_location", "end") != "end" or [n for n, _ in index] != ["bytes", "crc32c"]
            or [n for n, _ in inner_codecs] != ["bytes", "zstd"] or inner_codecs[0][1].get("endian", "little") != "little"
            or index[0][1].get("endian", "little") != "little"
            or key_encoding not in (None, {"name": "default"}, {"name": "default", "configuration": {"separator": "/"}})
            or meta.get("fill_value") not in (0, None, False) or sys.byteorder != "little"):
        return None
    if not shape:  # a scalar: one chunk, key "c"
        return [refs.get(f"{key}/c".encode())]
    count = -(-shape[0] // outer[0]) if outer[0] else 0
    if count > MAX_FILES:
        return None
    tail = "/0" * (len(shape) - 1)
    return [refs.get(f"{key}/c/{i}{tail}".encode()) for i in range(count)]


class OrbaxSource(m.BaseSource):
    """Values of one Orbax step through tensorstore.

    ``iter_blocks`` of an array stored as whole rows of chunks the way Orbax writes them (one
    chunk per device shard, split on the first axis or not at all: :func:`_row_chunks`) streams
    each chunk's zstd frame from its data file in pieces (``zstandard``), never holding a decoded
    chunk: tensorstore decodes a chunk whole (64 MiB for a 4096x4096 float32 kernel on one
    device) and holds about two copies while it does. Every other array, and ``read``, go through
    tensorstore. ``concurrent_reads`` is on when that costs little: a streamed array holds a few
    MiB, so ``diff`` reads two at once on two cores, unless an array tensorstore reads has chunks
    over :data:`CONCURRENT_CHUNK_BYTES` (two decoded at once would double the peak: 463 MiB
    instead of 274 for 64 MiB chunks). On the 1 GB bench steps: 3.4 s and 59 MiB, beside 16-20 s
    and 272 MiB through tensorstore one at a time (``benchmarks/run.py --only diff-orbax``).
    """

    concurrent_reads = True

    def __init__(self, step: str, pytree: str, arrays: dict[str, _Array], files: list[str],
                 database: Database | None = None):
        self.step = step
        self.pytree = pytree
        self._arrays = arrays
        self._files = tuple(files)
        self._context: Any = None  # tensorstore's, made with the first value read
        self._db = database
        self.concurrent_reads = all(
            a.rows is not None and database is not None
            or math.prod(min(c, n) for c, n in zip(a.chunk, a.shape)) * m.ITEMSIZE.get(a.dtype, 8) <= CONCURRENT_CHUNK_BYTES
            for a in arrays.values())
        self._lock = threading.Lock()
        self._open: dict[str, Any] = {}

    def _store(self, var: m.Variable) -> Any:
        with self._lock:
            store = self._open.get(var.key)
        if store is not None:
            return store
        ts = tensorstore()
        with self._lock:
            if self._context is None:
                self._context = _context(ts)
        arr = self._arrays.get(var.key)
        if arr is None:
            raise CorruptCheckpointError(f"{self.step}: no array {var.key!r}")
        spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": _kvstore_base(self.pytree), "path": var.key + "/"}}
        try:
            store = ts.open(spec, context=self._context, open=True, read=True).result()
        except Exception as e:  # tensorstore raises ValueError for every failure
            raise CorruptCheckpointError(f"{self.step}: {var.key}: cannot be opened: {_message(e)}") from None
        if tuple(store.shape) != var.shape:
            raise CorruptCheckpointError(f"{self.step}: {var.key}: tensorstore reads shape {list(store.shape)}, its zarr.json declared {list(var.shape)}")
        with self._lock:
            self._open[var.key] = store
        return store

    def _read(self, store: Any, var: m.Variable, index: Any) -> np.ndarray:
        import numpy as np  # noqa: PLC0415

        try:
            value = store[index].read().result() if index is not None else store.read().result()
        except Exception as e:
            raise CorruptCheckpointError(f"{self.step}: {var.key}: unreadable: {_message(e)}") from None
        want = m.numpy_dtype(var.dtype)
        if want is not None and value.dtype != want:
            value = value.view(want) if value.dtype.itemsize == want.itemsize else value.astype(want)
        return np.ascontiguousarray(value)

    def read(self, variable: m.Variable) -> np.ndarray:
        if m.numpy_dtype(variable.dtype) is None:
            raise CorruptCheckpointError(f"{self.step}: {variable.key}: dtype {variable.dtype} cannot be read")
        value = self._read(self._store(variable), variable, None)
        if value.shape != tuple(variable.shape):
            if value.size != variable.size:
                raise CorruptCheckpointError(f"{self.step}: {variable.key}: holds {value.size} values, its metadata"
                                             f" declares {m.format_shape(variable.shape)}")
            value = value.reshape(variable.shape)  # a scalar is stored as one element of shape [1]
        return value

    def iter_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        """The flattened value in blocks of ``elements``: streamed chunk by chunk from the zstd
        frames for arrays stored as whole rows of chunks, else in row bands of whole chunk rows
        through tensorstore (memory: about one band of chunks, never the whole array)."""
        if m.numpy_dtype(variable.dtype) is None:
            raise CorruptCheckpointError(f"{self.step}: {variable.key}: dtype {variable.dtype} cannot be read")
        arr = self._arrays.get(variable.key)
        if arr is not None and arr.rows is not None and self._db is not None and variable.size:
            return self._streamed(variable, arr, max(1, elements))
        return self._tensorstore_blocks(variable, elements)

    def _streamed(self, var: m.Variable, arr: _Array, elements: int) -> Iterator[np.ndarray]:
        """Each chunk's zstd frame decoded in pieces, its rows in the array cropped, cut into
        blocks of ``elements``; a chunk never written is its fill value."""
        import numpy as np  # noqa: PLC0415

        dtype = m.numpy_dtype(var.dtype)
        assert dtype is not None and self._db is not None
        row = math.prod(var.shape[1:])  # 1 for a scalar (one chunk of one row)
        chunk_rows, total_rows = (arr.chunk[0], var.shape[0]) if var.shape else (1, 1)
        item = dtype.itemsize
        step = max(1, elements) * item
        where = f"{self.step}: {var.key}"
        pending = bytearray()
        for i, ref in enumerate(arr.rows or ()):
            rows = min(chunk_rows, total_rows - i * chunk_rows)
            want = rows * row * item  # the rows inside the array (an edge chunk is padded)
            for piece in self._chunk_bytes(ref, chunk_rows * row * item, want, where, dtype):
                if not pending and len(piece) == step:  # the usual case: a whole block, no copy
                    yield np.frombuffer(piece, dtype=dtype)
                    continue
                pending += piece
                while len(pending) >= step:
                    yield np.frombuffer(bytes(pending[:step]), dtype=dtype)  # little-endian, as the host
                    del pending[:step]
        if pending:
            yield np.frombuffer(bytes(pending), dtype=dtype)

    def _chunk_bytes(self, ref: ValueRef | None, whole: int, want: int, where: str, dtype: Any) -> Iterator[bytes]:
        """The first ``want`` of the ``whole`` decoded bytes of one chunk, in pieces."""
        import struct  # noqa: PLC0415

        import google_crc32c  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415
        import zstandard  # noqa: PLC0415

        from .._zip import FileWindow  # noqa: PLC0415 - zipfile's import is not the listing's to pay

        piece = 1 << 20
        if ref is None:  # never written: the fill value (0: _row_chunks streams no other)
            one = np.zeros(1, dtype=dtype).tobytes()
            for start in range(0, want, piece):
                yield one * (min(piece, want - start) // len(one))
            return
        if ref.length < 20:
            raise CorruptCheckpointError(f"{where}: a chunk of {ref.length} bytes, shorter than its shard index")
        remote = _fs.is_remote(self._db.path)
        if remote and ref.inline is None and ref.length <= REMOTE_WHOLE_CHUNK_BYTES:  # one ranged read, not two
            ref = ValueRef(ref.length, self._db.read_value(ref))
        if ref.inline is not None:
            tail = ref.inline[-20:]
        else:
            tail = self._db._read(ref.path or "", ref.offset + ref.length - 20, 20, "a shard index")  # noqa: SLF001
        if google_crc32c.value(tail[:16]) != struct.unpack("<I", tail[16:])[0]:
            raise CorruptCheckpointError(f"{where}: the shard index checksum does not match")
        offset, nbytes = struct.unpack("<QQ", tail[:16])
        if offset == nbytes == (1 << 64) - 1:
            yield from self._chunk_bytes(None, whole, want, where, dtype)
            return
        if offset + nbytes > ref.length - 20:
            raise CorruptCheckpointError(f"{where}: the shard index points past the chunk ({offset}+{nbytes})")
        read_size = zstandard.DECOMPRESSION_RECOMMENDED_INPUT_SIZE
        if ref.inline is not None:
            stream: Any = io.BytesIO(ref.inline[offset : offset + nbytes])
        elif remote:  # reads of 1 MiB: the remote file streams them in large ranges, read ahead
            stream = FileWindow(_fs.open_binary(_fs.join(self._db.path, ref.path or "")), ref.offset + offset, nbytes)
            read_size = REMOTE_READ_BYTES
        else:
            full = os.path.join(self._db.path, ref.path or "")
            _fs.check_regular(full)
            stream = FileWindow(open(full, "rb"), ref.offset + offset, nbytes)  # noqa: SIM115 - closed below
        got = 0
        buffer = memoryview(bytearray(min(piece, whole)))  # decoded into in place: one buffer a chunk
        try:
            with zstandard.ZstdDecompressor().stream_reader(stream, read_size=read_size, closefd=False) as reader:
                while got < whole:
                    n = reader.readinto(buffer[: min(piece, whole - got)])
                    if not n:
                        break
                    if got < want:
                        yield buffer[: min(n, want - got)]
                    got += n
                if got != whole or reader.read(1):
                    raise CorruptCheckpointError(f"{where}: a chunk decodes to {got}{'+' if got == whole else ''} bytes,"
                                                 f" its shape says {whole}")
        except zstandard.ZstdError as e:
            raise CorruptCheckpointError(f"{where}: unreadable: a chunk's zstd data does not decode: {e}") from None
        finally:
            stream.close()

    def _tensorstore_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        store = self._store(variable)
        shape = variable.shape
        if len(shape) == 0 or variable.size == 0:
            yield self._read(store, variable, None).reshape(-1)
            return
        elements = max(1, elements)
        row = math.prod(shape[1:])
        if row > elements and len(shape) > 1:  # one row is already more than a block: rows one by one, split
            for i in range(shape[0]):
                value = self._read(store, variable, i).reshape(-1)
                for j in range(0, value.size, elements):
                    yield value[j : j + elements]
            return
        # Whole chunk rows at a time: tensorstore decodes a chunk whole, so a band cutting through
        # chunks would decode each of them once per band. A band is then handed out in blocks.
        chunk_rows = max(1, min(shape[0], self._arrays[variable.key].chunk[0] if variable.key in self._arrays else 1))
        rows = max(1, elements // max(1, row))
        rows = chunk_rows if rows <= chunk_rows else rows - rows % chunk_rows
        for start in range(0, shape[0], rows):
            band = self._read(store, variable, slice(start, min(shape[0], start + rows))).reshape(-1)
            if band.size <= elements:
                yield band
                continue
            for j in range(0, band.size, elements):
                yield band[j : j + elements]
            del band

    def storage_order(self, variable: m.Variable) -> tuple:
        return (variable.key,)

    def files(self) -> tuple[str, ...]:
        return self._files

    def close(self) -> None:
        with self._lock:
            self._open.clear()


# -- opening ----------------------------------------------------------------------------------------
def _context(ts: Any) -> Any:
    return ts.Context({"cache_pool": {"total_bytes_limit": CACHE_BYTES}, "data_copy_concurrency": {"limit": 2},
                       "file_io_concurrency": {"limit": 4}})


def _database(base: str) -> Database:
    try:
        return open_database(base)
    except CorruptCheckpointError as e:
        raise CorruptCheckpointError(f"{base}: the OCDBT database cannot be opened: {one_line(e)}") from None


def _chunk_owners(layout: StepLayout, problems: list[str]) -> dict[str, set[int]]:
    """Array key -> the processes whose own database holds chunks of it (keys listed only)."""
    owners: dict[str, set[int]] = {}
    for n in layout.processes:
        base = _fs.join(layout.pytree, f"{PROCESS_PREFIX}{n}")
        if not _fs.isfile(_fs.join(base, MANIFEST)):
            problems.append(f"{base}: no {MANIFEST} (process {n}'s database is incomplete)")
            continue
        try:
            keys = [k for k, _ in _database(base).items(with_values=False)]
        except (CorruptCheckpointError, UnsafeFileError) as e:  # a damaged per-process database: say so, read through the joined one
            problems.append(f"{base}: cannot be listed: {one_line(e)}")
            continue
        for k in keys:
            name, sep, rest = k.decode("utf-8", "surrogateescape").rpartition("/c")
            if not sep:
                continue
            if rest == "" or rest.startswith("/"):
                owners.setdefault(name, set()).add(n)
    return owners


# Scalars decoded from their database entry (little-endian, as the zarr ``bytes`` codec says).
_SCALAR_FORMATS = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint8": "B", "uint16": "H", "uint32": "I",
                   "uint64": "Q", "float16": "e", "float32": "f", "float64": "d"}


def _codec(c: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(c, dict) or not isinstance(c.get("name"), str):
        return "", {}
    conf = c.get("configuration")
    return c["name"], conf if isinstance(conf, dict) else {}


def _inner_bytes(codecs: Any, data: bytes, where: str) -> bytes | None:
    """A chunk's bytes through ``bytes`` (little-endian) and an optional ``zstd``; None for
    other codecs."""
    names = [_codec(c) for c in codecs] if isinstance(codecs, list) else [("", {})]
    if not names or names[0][0] != "bytes" or names[0][1].get("endian", "little") != "little":
        return None
    for name, _ in names[1:]:
        if name != "zstd":
            return None
        data = zstd_decompress(data, 1 << 16, where)
    return data


def scalar_from_entry(meta: dict[str, Any], raw: bytes, where: str) -> float | None:
    """The value of a scalar array from its one chunk's stored bytes, decoded as Orbax writes it:
    ``sharding_indexed`` (one inner chunk, the index ``bytes`` + ``crc32c`` at the end) over
    ``bytes`` and ``zstd``, or ``bytes`` and ``zstd`` alone. None when stored otherwise (tensorstore
    reads it then).

    Raises:
        CorruptCheckpointError: The entry is stored that way but does not decode.
    """
    import struct  # noqa: PLC0415

    fmt = _SCALAR_FORMATS.get(str(meta.get("data_type")))
    codecs = meta.get("codecs")
    if fmt is None or meta.get("shape") != [] or not isinstance(codecs, list) or len(codecs) != 1 and not (
            codecs and _codec(codecs[0])[0] == "bytes"):
        return None
    name, conf = _codec(codecs[0])
    if name == "sharding_indexed":
        index = [_codec(c) for c in conf.get("index_codecs") or ()]
        if conf.get("index_location", "end") != "end" or [n for n, _ in index] != ["bytes", "crc32c"] or \
                index[0][1].get("endian", "little") != "little" or len(raw) < 20:
            return None
        import google_crc32c  # noqa: PLC0415

        table, crc = raw[-20:-4], struct.unpack("<I", raw[-4:])[0]
        if google_crc32c.value(table) != crc:
            raise CorruptCheckpointError(f"{where}: the shard index checksum does not match")
        offset, nbytes = struct.unpack("<QQ", table)
        if offset == nbytes == (1 << 64) - 1:  # an empty chunk: the fill value
            fill = meta.get("fill_value")
            return float(fill) if isinstance(fill, (int, float)) and not isinstance(fill, bool) else None
        if offset + nbytes > len(raw) - 20:
            raise CorruptCheckpointError(f"{where}: the shard index points past the chunk ({offset}+{nbytes})")
        data = _inner_bytes(conf.get("codecs"), raw[offset : offset + nbytes], where)
    else:
        data = _inner_bytes(codecs, raw, where)
    if data is None:
        return None
    if len(data) != struct.calcsize("<" + fmt):
        raise CorruptCheckpointError(f"{where}: a scalar of {len(data)} bytes, its dtype says {struct.calcsize('<' + fmt)}")
    return float(struct.unpack("<" + fmt, data)[0])


def _iterations(source: OrbaxSource, variables: list[m.Variable], db: Database, refs: dict[bytes, ValueRef],
                metas: dict[str, dict[str, Any]]) -> tuple[str, int] | None:
    for v in variables:
        if v.role == m.ROLE_OPTIMIZER and v.shape == () and v.key.rsplit(".", 1)[-1] in ITERATION_NAMES and v.dtype in m.INTEGER_DTYPES | m.FLOAT_DTYPES:
            ref = refs.get(f"{v.key}/c".encode())
            value: float | None = None
            try:
                if ref is not None and ref.length <= 1 << 16:
                    value = scalar_from_entry(metas.get(v.key, {}), db.read_value(ref), f"{db.path}: {v.key}/c")
                if value is None:  # stored some other way: tensorstore reads it
                    value = float(source.read(v).reshape(()))
            except CorruptCheckpointError:
                return None
            return (v.key, int(value)) if math.isfinite(value) else None
    return None


def _mesh_text(entries: tuple[ArrayEntry, ...]) -> str | None:
    meshes = {tuple(e.mesh.items()) for e in entries if e.mesh}
    if not meshes:
        return None
    if len(meshes) > 1:
        return f"{len(meshes)} meshes"
    return ", ".join(f"{k}={v}" for k, v in next(iter(meshes)))


class _Opened:
    """A step opened: its checkpoint and what was found wrong on the way (lenient opening)."""

    def __init__(self, ckpt: m.Checkpoint, damaged: list[m.Damage], problems: list[str]):
        self.ckpt, self.damaged, self.problems = ckpt, damaged, problems


def _open(path: str, lenient: bool) -> _Opened:
    path = str(path).rstrip("/") or "/"
    if _fs.is_remote(path):  # one listing first: every name the layout asks about is answered from it
        files = _walk_files(path)
        _fs.warm_remote(_small_files(path, files))  # then the small files read whole, in one round trip
        layout = read_step_layout(path)
    else:
        layout = read_step_layout(path)
        files = _walk_files(path)
    problems = list(layout.problems)
    if not layout.has_manifest:
        raise CorruptCheckpointError(f"{layout.pytree}: no {MANIFEST} (the processes' databases were never joined)")
    db = _database(layout.pytree)
    arrays_keys = {e.key.encode() for e in layout.arrays}
    try:  # each array's zarr.json and chunks (where they are; values are read later)
        refs = {k: ref for k, ref in db.items() if k.rpartition(b"/zarr.json")[0] in arrays_keys
                or k.partition(b"/c")[0] in arrays_keys}
    except CorruptCheckpointError as e:
        raise CorruptCheckpointError(f"{layout.pytree}: the OCDBT database cannot be read: {one_line(e)}") from None
    owners = _chunk_owners(layout, problems)
    variables: list[m.Variable] = []
    arrays: dict[str, _Array] = {}
    metas: dict[str, dict[str, Any]] = {}
    damaged: list[m.Damage] = []
    specs: dict[str, str] = {}
    for entry in layout.arrays:
        name = readable_name(entry.path)
        try:
            ref = refs.get(f"{entry.key}/{ZARR_JSON}".encode())
            if ref is None:
                raise CorruptCheckpointError(f"{layout.pytree}: {entry.key}: in the tree metadata but not in the database (no {ZARR_JSON})")
            if ref.length > MAX_ZARR_JSON_BYTES:
                raise UnsafeFileError(f"{layout.pytree}: {entry.key}/{ZARR_JSON} is {ref.length} bytes; refusing")
            shape, dtype, chunk, meta = _shape_dtype(entry.key, db.read_value(ref), layout.pytree)
        except (CorruptCheckpointError, UnsafeFileError) as e:
            if not lenient:
                raise
            damaged.append(m.Damage(key=entry.key, name=name, file=layout.pytree, kind=m.DAMAGE_LAYOUT, problem=str(e)))
            continue
        arrays[entry.key] = _Array(entry.key, shape, dtype, chunk, _row_chunks(meta, shape, entry.key, refs))
        metas[entry.key] = meta
        nbytes = math.prod(shape) * m.ITEMSIZE.get(dtype, 1)
        variables.append(m.Variable(key=entry.key, name=name, shape=shape, dtype=dtype, nbytes=nbytes,
                                    shards=tuple(sorted(owners.get(entry.key, ()))), role=role_of(entry.path)))
        if entry.partition_spec is not None:
            specs[entry.key] = entry.spec_text
    names = [v.name for v in variables]
    if len(set(names)) != len(names):  # two groups giving one name: show the stored keys
        variables = [dataclasses.replace(v, name=v.key.replace(".", "/")) for v in variables]
    source = OrbaxSource(path, layout.pytree, arrays, files, db)
    candidates = step_candidates(_iterations(source, variables, db, refs, metas))
    step, step_source = training_step(candidates)
    number = step_of_name(path)
    info: dict[str, Any] = dict(layout.config_summary)
    info.pop("model_config_json", None)
    mesh = _mesh_text(layout.arrays)
    if mesh:
        info["mesh"] = mesh
    if specs:
        info["partition_specs"] = specs
    info["processes"] = list(layout.processes)
    for label, field in (("saved", "init_timestamp_nsecs"), ("committed", "commit_timestamp_nsecs")):
        when = _iso(layout.metadata.get(field))
        if when:
            info["date_saved" if label == "saved" else "date_committed"] = when
    info["committed"] = layout.committed
    if candidates:
        info["step_candidates"] = candidates
        it = next((k for k in candidates if k.startswith("optimizer:")), None)
        if it:
            info["iterations_key"] = it.split(":", 1)[1]
    if layout.skipped:
        info["not_arrays"] = list(layout.skipped)
    if problems:
        info["warnings"] = list(problems)
    ckpt = m.Checkpoint(path=path, format=FORMAT_ORBAX, variables=tuple(variables),
                        step=step, step_source=step_source, number=number,
                        number_source="name:checkpoint" if number is not None else None,
                        num_shards=max(1, len(layout.processes)), info=info, source=source)
    return _Opened(ckpt, damaged, problems)


def open_orbax(path: str) -> m.Checkpoint:
    """Open one Orbax step directory (metadata only; values on demand through tensorstore).

    Args:
        path: ``DIR/<step>`` as ``keras.callbacks.OrbaxCheckpoint`` (orbax-checkpoint) writes it.

    Returns:
        The :class:`~ckptinspect.model.Checkpoint` (format ``orbax``): names such as
        ``sequential/dense_1/kernel``, ``Variable.shards`` the processes whose databases hold its
        chunks; ``info``: ``mesh``, ``partition_specs``, ``processes``, save and commit times, the
        model config's summary, ``step_candidates``.

    Raises:
        UsageError: tensorstore is not installed.
        NotACheckpointError, CorruptCheckpointError, UnsafeFileError.
    """
    return _open(path, lenient=False).ckpt


def check_orbax(path: str) -> Check:
    """``verify``'s plan for an Orbax step: commit markers, the joined manifest and each process'
    database, every array's metadata, every chunk read with its declared shape and dtype.
    Interrupted saves and missing databases are named; no checksum of chunk data exists to check."""
    from .._readcheck import CHECK_BLOCK_ELEMENTS  # noqa: PLC0415

    opened: _Opened | None = None
    failure: str | None = None
    try:
        opened = _open(path, lenient=True)
    except (CorruptCheckpointError, UnsafeFileError, NotACheckpointError) as e:
        failure = str(e)

    def run(progress: m.Progress | None, done: int, total: int | None) -> m.CheckResult:
        if opened is None:
            return m.CheckResult(path, FORMAT_ORBAX, m.STATUS_DAMAGED, problems=(failure or "unreadable",))
        ckpt = opened.ckpt
        damaged = list(opened.damaged)
        problems = list(opened.problems)
        if not ckpt.info.get("committed"):
            problems.append(f"{path}: an interrupted save (no commit timestamp, no {COMMIT_MARKER})")
        nbytes = 0
        total = len(ckpt.variables) if total is None else total
        for var in ckpt.variables:
            try:
                # through tensorstore (the reader Orbax uses), not the streamed path of iter_blocks
                for block in ckpt.source._tensorstore_blocks(var, CHECK_BLOCK_ELEMENTS):  # noqa: SLF001
                    nbytes += block.nbytes
            except CorruptCheckpointError as e:
                damaged.append(m.Damage(key=var.key, name=var.name, file=ckpt.path, kind=m.DAMAGE_UNREADABLE, problem=str(e)))
            done += 1
            if progress is not None:
                progress(done, total, var)
        status = m.STATUS_DAMAGED if damaged or problems else m.STATUS_INTACT
        return m.CheckResult(path, FORMAT_ORBAX, status, step=ckpt.step, tensors=len(ckpt.variables), nbytes=nbytes,
                             problems=tuple(problems), damaged=tuple(damaged))

    check = Check(path, run, total=len(opened.ckpt.variables) if opened else 0)
    check.notes = (NO_CHECKSUM_NOTE,)  # verify shows it: what this check cannot prove
    return check
