"""``verify``: find damaged checkpoints without TensorFlow.

A TF bundle is intact when its ``.index`` parses, every data shard the header declares exists
and is long enough for every entry, and every stored tensor (each stored slice of a sliced
one) has the checksum the index records for it. The bytes are streamed from the data files,
one tensor at a time, in file order, and checked with crc32c from ``google-crc32c``.

What TensorFlow stores as ``BundleEntryProto.crc32c`` (tensorflow/core/util/tensor_bundle/
tensor_bundle.cc, ``BundleWriter::Add``) is the *masked* crc32c of:

* numeric and bool tensors: their raw bytes;
* string tensors (``WriteStringTensor``): each element's length as a little-endian uint32
  (uint64 above 4 GiB), *not* the varint bytes on disk, then the 4-byte masked checksum of those
  lengths as stored, then the string bytes;
* variant tensors (``WriteVariantTensor``): for each element, its length as a little-endian
  uint64, its bytes and its stored 4-byte checksum.

A checkpoint directory is verified checkpoint by checkpoint (every retained one, as
``ckptinspect ls`` lists them); a V1 table file by the checksums of its blocks; an HDF5 or
``.keras`` file by opening it and reading every dataset.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
import zipfile
from typing import Any, Callable, Iterator

from .. import model as m
from ..errors import CheckpointNotFoundError, CkptError, CorruptCheckpointError, NotACheckpointError
from ..formats import Kind, _fs, detect
from ..formats._crc import crc32c_module, mask
from ..formats._sstable import iter_table
from ..formats._wire import MalformedError, read_varint
from ..formats.tf_bundle import INDEX_SUFFIX, ITEMSIZE, data_path, read_index, step_from_name

__all__ = [
    "FORMAT_DIRECTORY",
    "STATUS_INTACT",
    "STATUS_DAMAGED",
    "STATUS_MISSING",
    "Damage",
    "CheckpointResult",
    "VerifyReport",
    "verify",
    "verify_bundle",
    "tensor_crc32c",
]

FORMAT_DIRECTORY = "tf-directory"  # VerifyReport.format for a checkpoint directory
STATUS_INTACT = "intact"
STATUS_DAMAGED = "damaged"
STATUS_MISSING = "missing"

# What went wrong with one tensor (``Damage.kind``).
DAMAGE_CHECKSUM = "checksum"
DAMAGE_TRUNCATED = "truncated"
DAMAGE_MISSING_SHARD = "missing-shard"
DAMAGE_SIZE = "size"
DAMAGE_LAYOUT = "layout"
DAMAGE_MISSING_SLICE = "missing-slice"
DAMAGE_UNREADABLE = "unreadable"

VARIABLE_LENGTH_DTYPES = ("string", "variant")
CHUNK_BYTES = 8 << 20  # bytes read (and checksummed) at a time
_UINT32_MAX = 0xFFFFFFFF

Progress = Callable[[int, int, Any], None]


# -- report ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Damage:
    """One damaged tensor (or dataset).

    Attributes:
        key: The key in the index (or dataset path in an HDF5 file).
        name: Its readable name (the key when no better name is known).
        file: The file holding its bytes (the data shard for TF bundles).
        kind: ``checksum``, ``truncated``, ``missing-shard``, ``size``, ``layout``,
            ``missing-slice`` or ``unreadable``.
        problem: One line saying what is wrong.
        shard: The data shard number, or None.
        offset: Byte offset in ``file``, or None.
        size: Bytes the index records for it, or None.
        slice: For a stored slice of a sliced variable, which one (``[0:4,:]``), else None.
        stored_crc32c: The masked crc32c the index records, or None.
        actual_crc32c: The masked crc32c of the bytes on disk, or None.
    """

    key: str
    name: str
    file: str
    kind: str
    problem: str
    shard: int | None = None
    offset: int | None = None
    size: int | None = None
    slice: str | None = None
    stored_crc32c: int | None = None
    actual_crc32c: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CheckpointResult:
    """The verdict on one checkpoint (one prefix, V1 file, HDF5 or ``.keras`` file).

    Attributes:
        path: The prefix or file.
        format: One of :data:`ckptinspect.model.FORMATS`, or None when it could not be told.
        status: ``intact``, ``damaged`` or ``missing``.
        step: Step number from the name, or None.
        latest: The checkpoint a directory resolves to.
        in_state_file: Listed by the directory's ``checkpoint`` state file.
        tensors: Tensors (stored slices, datasets) checked.
        nbytes: Bytes checked.
        problems: File-level problems (index, missing or short shards), one line each.
        damaged: Damaged tensors, in file order.
    """

    path: str
    format: str | None
    status: str
    step: int | None = None
    latest: bool = False
    in_state_file: bool = False
    tensors: int = 0
    nbytes: int = 0
    problems: tuple[str, ...] = ()
    damaged: tuple[Damage, ...] = ()

    @property
    def intact(self) -> bool:
        return self.status == STATUS_INTACT

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["damaged"] = [d.to_dict() for d in self.damaged]
        out["problems"] = list(self.problems)
        return out


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` found.

    Attributes:
        path: The path as given.
        format: The format of the checkpoint(s), or ``tf-directory`` for a directory.
        directory: True when ``path`` is a checkpoint directory.
        checkpoints: One result per checkpoint: for a directory every retained one (state
            file order, then ones only on disk), otherwise exactly one.
    """

    path: str
    format: str
    directory: bool
    checkpoints: tuple[CheckpointResult, ...]

    @property
    def intact(self) -> bool:
        """Every checkpoint exists and is whole."""
        return all(c.intact for c in self.checkpoints)

    @property
    def damaged(self) -> list[tuple[CheckpointResult, Damage]]:
        """Every damaged tensor, with its checkpoint."""
        return [(c, d) for c in self.checkpoints for d in c.damaged]

    @property
    def first_damaged(self) -> tuple[CheckpointResult, Damage] | None:
        """The first damaged tensor in file order (of the first checkpoint with damage)."""
        found = self.damaged
        return found[0] if found else None

    @property
    def newest_intact(self) -> CheckpointResult | None:
        """The intact checkpoint with the highest step; among equal (or no) steps the one the
        directory resolves to, else the later-listed one."""
        intact = [(i, c) for i, c in enumerate(self.checkpoints) if c.intact]
        if not intact:
            return None
        return max(intact, key=lambda ic: (ic[1].step if ic[1].step is not None else -1, ic[1].latest, ic[0]))[1]

    def summary(self) -> dict[str, int]:
        """Counts: checkpoints by status, tensors checked and damaged."""
        return {
            "checkpoints": len(self.checkpoints),
            STATUS_INTACT: sum(c.status == STATUS_INTACT for c in self.checkpoints),
            STATUS_DAMAGED: sum(c.status == STATUS_DAMAGED for c in self.checkpoints),
            STATUS_MISSING: sum(c.status == STATUS_MISSING for c in self.checkpoints),
            "tensors": sum(c.tensors for c in self.checkpoints),
            "damaged_tensors": sum(len(c.damaged) for c in self.checkpoints),
            "bytes": sum(c.nbytes for c in self.checkpoints),
        }

    def to_dict(self) -> dict[str, Any]:
        """The ``verify --format json`` document (see README, ``ckptinspect verify``)."""
        first = self.first_damaged
        newest = self.newest_intact
        return {
            "path": self.path,
            "format": self.format,
            "intact": self.intact,
            "newest_intact": newest.path if newest else None,
            "first_damaged": ({"checkpoint": first[0].path, **first[1].to_dict()} if first else None),
            "summary": self.summary(),
            "checkpoints": [c.to_dict() for c in self.checkpoints],
        }


# -- checksums ---------------------------------------------------------------------------
def _num_elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def tensor_crc32c(dtype: str, shape: tuple[int, ...], raw: bytes) -> int:
    """The masked crc32c TensorFlow records for a tensor stored as ``raw`` (whole in memory).

    Args:
        dtype: Numpy-style dtype name (``string`` and ``variant`` have their own layouts).
        shape: The stored shape (the slice's shape for a stored slice).
        raw: The stored bytes.

    Returns:
        The masked crc32c.

    Raises:
        MalformedError: A string or variant layout that does not decode.
    """
    crc32c = crc32c_module()
    if dtype == "string":
        return mask(_string_crc(raw, _num_elements(shape), crc32c))
    if dtype == "variant":
        return mask(_variant_crc(raw, _num_elements(shape), crc32c))
    return mask(crc32c.value(raw))


def _string_crc(raw: bytes, count: int, crc32c) -> int:
    lengths = []
    pos = 0
    for _ in range(count):
        length, pos = read_varint(raw, pos)
        lengths.append(length)
    if pos + 4 > len(raw):
        raise MalformedError(f"string tensor of {count} elements: {len(raw)} bytes cannot hold its length checksum")
    if all(n <= _UINT32_MAX for n in lengths):
        packed = struct.pack(f"<{count}I", *lengths)
    else:
        packed = b"".join(struct.pack("<I" if n <= _UINT32_MAX else "<Q", n) for n in lengths)
    crc = crc32c.value(packed)
    stored_lengths_crc = struct.unpack_from("<I", raw, pos)[0]
    if mask(crc) != stored_lengths_crc:
        raise MalformedError("string tensor: the checksum of its element lengths does not match")
    crc = crc32c.extend(crc, raw[pos : pos + 4])
    body = raw[pos + 4 :]
    if len(body) != sum(lengths):
        raise MalformedError(
            f"string tensor: element lengths add up to {sum(lengths)} bytes, {len(body)} are stored"
        )
    return crc32c.extend(crc, body)


def _variant_crc(raw: bytes, count: int, crc32c) -> int:
    crc = 0
    pos = 0
    for i in range(count):
        length, pos = read_varint(raw, pos)
        if pos + length + 4 > len(raw):
            raise MalformedError(f"variant tensor: element {i} runs past the stored bytes")
        crc = crc32c.extend(crc, struct.pack("<Q", length))
        crc = crc32c.extend(crc, raw[pos : pos + length])
        pos += length
        if mask(crc) != struct.unpack_from("<I", raw, pos)[0]:
            raise MalformedError(f"variant tensor: the checksum of element {i} does not match")
        crc = crc32c.extend(crc, raw[pos : pos + 4])
        pos += 4
    if pos != len(raw):
        raise MalformedError(f"variant tensor: {len(raw) - pos} bytes after its {count} elements")
    return crc


# -- TF bundles --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Item:
    """One stored run of bytes to check: a tensor, or one stored slice of a sliced tensor."""

    key: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None
    slice: str | None = None


def _fmt_slice(starts: tuple[int, ...], lengths: tuple[int, ...]) -> str:
    parts = [":" if ln < 0 else f"{st}:{st + ln}" for st, ln in zip(starts, lengths)]
    return "[" + ",".join(parts) + "]"


def _names(prefix: str, index) -> dict[str, str]:
    """Readable names by key, best effort (the object graph itself may be what is damaged)."""
    from ..formats.tf_bundle import build_variables  # noqa: PLC0415

    try:
        variables, _ = build_variables(prefix, index)
    except (CkptError, MalformedError, OSError):
        return {}
    return {v.key: v.name for v in variables}


def _items(prefix: str, index) -> tuple[list[_Item], list[Damage]]:
    """The byte runs to check, in file order, and slices declared but not stored."""
    names = _names(prefix, index)
    items: list[_Item] = []
    missing: list[Damage] = []
    for e in index.entries:
        name = names.get(e.key, e.key)
        if not e.slices:
            items.append(_Item(e.key, name, e.dtype, e.shape, e.shard_id, e.offset, e.size, e.crc32c))
            continue
        stored = index.slice_entries.get(e.key, ())
        for starts, lengths, se in stored:
            items.append(
                _Item(e.key, name, se.dtype, se.shape, se.shard_id, se.offset, se.size, se.crc32c,
                      slice=_fmt_slice(starts, lengths))
            )
        if len(stored) < len(e.slices):
            missing.append(
                Damage(
                    key=e.key,
                    name=name,
                    file=prefix + INDEX_SUFFIX,
                    kind=DAMAGE_MISSING_SLICE,
                    problem=f"declares {len(e.slices)} slices, the index holds {len(stored)}",
                )
            )
    items.sort(key=lambda it: (it.shard, it.offset, it.key))
    return items, missing


def _expected_size(item: _Item) -> int | None:
    itemsize = ITEMSIZE.get(item.dtype)
    return None if itemsize is None else itemsize * _num_elements(item.shape)


def _read_exact(f, size: int) -> Iterator[bytes]:
    """``size`` bytes from the current position, in chunks; stops early at end of file."""
    left = size
    while left > 0:
        chunk = f.read(min(CHUNK_BYTES, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


def _check_item(f, item: _Item, crc32c) -> tuple[str, str, int | None] | None:
    """Stream one item's bytes from the open shard ``f`` and compare checksums.

    Returns:
        None when intact, else (damage kind, problem, computed masked crc or None).
    """
    stored = item.crc32c if item.crc32c is not None else 0  # proto3 omits a zero field
    expected = _expected_size(item)
    if item.dtype not in VARIABLE_LENGTH_DTYPES and expected is not None and expected != item.size:
        return (DAMAGE_SIZE, f"the index records {item.size} bytes, a {item.dtype} tensor of shape "
                f"{list(item.shape)} takes {expected}", None)
    f.seek(item.offset)
    got = 0
    if item.dtype in VARIABLE_LENGTH_DTYPES:
        raw = b"".join(_read_exact(f, item.size))
        got = len(raw)
        if got == item.size:
            try:
                actual = tensor_crc32c(item.dtype, item.shape, raw)
            except MalformedError as e:
                return DAMAGE_LAYOUT, f"{item.dtype} tensor does not decode: {e}", None
    else:
        crc = 0
        for chunk in _read_exact(f, item.size):
            crc = crc32c.extend(crc, chunk)
            got += len(chunk)
        actual = mask(crc)
    if got < item.size:
        return DAMAGE_TRUNCATED, f"needs bytes {item.offset}..{item.offset + item.size}, only {got} could be read", None
    if actual != stored:
        return DAMAGE_CHECKSUM, f"checksum does not match: stored {stored:#010x}, computed {actual:#010x}", actual
    return None


@dataclasses.dataclass
class _BundlePlan:
    prefix: str
    format: str
    num_shards: int
    items: list[_Item]
    damaged: list[Damage]
    problems: list[str]
    sizes: dict[int, int | None]


def _plan_bundle(prefix: str, format: str) -> _BundlePlan | CheckpointResult:
    """Parse the index and stat the shards; a result already when the index is damaged."""
    try:
        index = read_index(prefix)
    except CorruptCheckpointError as e:
        return CheckpointResult(prefix, format, STATUS_DAMAGED, step=step_from_name(prefix), problems=(str(e),))
    items, damaged = _items(prefix, index)
    problems: list[str] = []
    sizes: dict[int, int | None] = {}
    for shard in range(index.num_shards):
        path = data_path(prefix, shard, index.num_shards)
        try:
            sizes[shard] = _fs.getsize(path)
        except OSError:
            sizes[shard] = None
            if _fs.exists(path):
                raise CheckpointNotFoundError(f"{path}: data shard cannot be read") from None
            problems.append(f"{path}: data shard is missing (named by {prefix}{INDEX_SUFFIX})")
    need: dict[int, int] = {}
    for it in items:
        need[it.shard] = max(need.get(it.shard, 0), it.offset + it.size)
    for shard, end in sorted(need.items()):
        size = sizes.get(shard)
        if size is not None and size < end:
            problems.append(
                f"{data_path(prefix, shard, index.num_shards)}: truncated: {size} bytes, the index needs {end}"
            )
    return _BundlePlan(prefix, format, index.num_shards, items, damaged, problems, sizes)


def _run_plan(plan: _BundlePlan, progress: Progress | None, counter: list[int]) -> CheckpointResult:
    """Check every item of a plan, one at a time, shard by shard in file order."""
    crc32c = crc32c_module()
    damaged = list(plan.damaged)
    nbytes = 0
    handles: dict[int, Any] = {}
    try:
        for it in plan.items:
            path = data_path(plan.prefix, it.shard, plan.num_shards)
            size = plan.sizes.get(it.shard)
            found: tuple[str, str, int | None] | None
            if size is None:
                found = DAMAGE_MISSING_SHARD, "its data shard is missing", None
            elif it.offset + it.size > size:
                found = DAMAGE_TRUNCATED, f"needs bytes {it.offset}..{it.offset + it.size}, the shard has {size}", None
            else:
                f = handles.get(it.shard)
                if f is None:
                    try:
                        f = handles[it.shard] = _open_binary(path)
                    except PermissionError:
                        raise CheckpointNotFoundError(f"{path}: permission denied") from None
                    except OSError as e:
                        raise CheckpointNotFoundError(f"{path}: cannot open the data shard: {e.strerror or e}") from None
                try:
                    found = _check_item(f, it, crc32c)
                except OSError as e:
                    found = DAMAGE_UNREADABLE, f"read error: {e.strerror or e}", None
                nbytes += it.size
            if found is not None:
                kind, problem, actual = found
                damaged.append(Damage(
                    key=it.key, name=it.name, file=path, kind=kind, problem=problem, shard=it.shard,
                    offset=it.offset, size=it.size, slice=it.slice,
                    stored_crc32c=it.crc32c if it.crc32c is not None else 0, actual_crc32c=actual,
                ))
            counter[0] += 1
            if progress is not None:
                progress(counter[0], counter[1], it)
    finally:
        for f in handles.values():
            f.close()
    status = STATUS_DAMAGED if damaged or plan.problems else STATUS_INTACT
    return CheckpointResult(
        plan.prefix, plan.format, status, step=step_from_name(plan.prefix), tensors=len(plan.items),
        nbytes=nbytes, problems=tuple(plan.problems), damaged=tuple(damaged),
    )


def verify_bundle(prefix: str, *, format: str = m.FORMAT_TF_BUNDLE, progress: Progress | None = None) -> CheckpointResult:
    """Verify one TF bundle checkpoint.

    Args:
        prefix: The checkpoint prefix (``PREFIX.index`` + ``PREFIX.data-*``).
        format: The format to report (``tf-bundle`` or ``tf-savedmodel``).
        progress: Called as ``progress(done, total, item)`` after each tensor.

    Returns:
        The :class:`CheckpointResult`; damage is reported in it, not raised.

    Raises:
        CheckpointNotFoundError: ``PREFIX.index`` or a data shard exists but cannot be read
            (or the index does not exist).
    """
    plan = _plan_bundle(prefix, format)
    if isinstance(plan, CheckpointResult):
        return plan
    return _run_plan(plan, progress, [0, len(plan.items)])


def _open_binary(path: str):
    if _fs.is_remote(path):
        return _fs._gfile().GFile(path, "rb")  # noqa: SLF001 - remote paths only
    return open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the caller


# -- V1 tables ---------------------------------------------------------------------------
def verify_v1(path: str) -> CheckpointResult:
    """Verify a V1 table checkpoint: every block's checksum (its tensors live in the blocks)."""
    try:
        data = _fs.read_bytes(path)
        count = 0
        for _ in iter_table(data, check_crc=True):
            count += 1
    except MalformedError as e:
        return CheckpointResult(path, m.FORMAT_TF_V1, STATUS_DAMAGED, problems=(f"{path}: {e}",))
    return CheckpointResult(path, m.FORMAT_TF_V1, STATUS_INTACT, tensors=max(count - 1, 0), nbytes=len(data))


# -- HDF5 and .keras (through the Keras readers: their safety checks, one read path) -------
def _zip_member_damage(path: str) -> list[Damage]:
    """Stream every archive member so zipfile checks its CRC-32 (after the reader's safety checks)."""
    damaged: list[Damage] = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            try:
                with zf.open(info) as member:
                    while member.read(CHUNK_BYTES):
                        pass
            except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as e:
                damaged.append(Damage(key=info.filename, name=info.filename, file=path, kind=DAMAGE_CHECKSUM,
                                      problem=f"archive member does not read: {' '.join(str(e).split())}"))
    return damaged


def verify_keras(path: str, progress: Progress | None = None) -> CheckpointResult:
    """Verify a Keras file (``.h5``, ``.weights.h5``, sharded weights, ``.keras``).

    The file must open (with the readers' refusal of links out of the file, external and
    virtual datasets, shape and zip bombs, path traversal) and every dataset must read; for a
    ``.keras`` archive every member's CRC-32 must match too.

    Raises:
        UnsafeFileError: The file asks for something unsafe; nothing is read.
        NotACheckpointError: Not a Keras file.
    """
    from ..formats import open_checkpoint  # noqa: PLC0415

    try:
        ckpt = open_checkpoint(path)
    except CorruptCheckpointError as e:
        return CheckpointResult(path, None, STATUS_DAMAGED, problems=(str(e),))
    damaged: list[Damage] = []
    nbytes = 0
    with ckpt:
        if ckpt.format == m.FORMAT_KERAS_ZIP and not _fs.is_remote(path):
            damaged = _zip_member_damage(path)
        total = len(ckpt.variables)
        for i, var in enumerate(ckpt.variables, 1):
            try:
                nbytes += int(getattr(ckpt.read(var), "nbytes", 0))
            except CorruptCheckpointError as e:
                damaged.append(Damage(key=var.key, name=var.name, file=path, kind=DAMAGE_UNREADABLE, problem=str(e)))
            if progress is not None:
                progress(i, total, var)
    status = STATUS_DAMAGED if damaged else STATUS_INTACT
    return CheckpointResult(path, ckpt.format, status, tensors=len(ckpt.variables), nbytes=nbytes,
                            damaged=tuple(damaged))


# -- entry point -------------------------------------------------------------------------
def _classify(path: str) -> tuple[Kind, str]:
    """Like :func:`ckptinspect.formats.detect`, but a damaged ``.index`` is still a bundle."""
    if path.endswith(INDEX_SUFFIX) and _fs.isfile(path):
        return Kind.TF_BUNDLE, path[: -len(INDEX_SUFFIX)]
    if not _fs.exists(path) and _fs.isfile(path + INDEX_SUFFIX):
        return Kind.TF_BUNDLE, path
    return detect(path)


def _verify_directory(directory: str, progress: Progress | None) -> VerifyReport:
    from ..formats.tf_state import STATE_FILE, list_checkpoints  # noqa: PLC0415

    retained, latest = list_checkpoints(directory)
    if latest is None and not retained:
        # No TF bundle at all: a directory of V1 files, or nothing (open() says which).
        from ..formats import open_checkpoint  # noqa: PLC0415

        with open_checkpoint(directory) as ckpt:
            result = verify_v1(ckpt.path)
        return VerifyReport(directory, m.FORMAT_TF_V1, True, (result,))
    plans: list[tuple[m.RetainedCheckpoint, _BundlePlan | CheckpointResult | None]] = []
    for c in retained:
        if c.exists and _fs.isfile(c.path + INDEX_SUFFIX):
            plans.append((c, _plan_bundle(c.path, m.FORMAT_TF_BUNDLE)))
        else:
            plans.append((c, None))
    counter = [0, sum(len(p.items) for _, p in plans if isinstance(p, _BundlePlan))]
    results = []
    for c, plan in plans:
        common = dict(step=c.step, latest=c.latest, in_state_file=c.in_state_file)
        if isinstance(plan, _BundlePlan):
            result = _run_plan(plan, progress, counter)
        elif isinstance(plan, CheckpointResult):
            result = plan
        elif c.exists:
            result = verify_v1(c.path)
        else:
            result = CheckpointResult(c.path, None, STATUS_MISSING, problems=(
                f"{c.path}: listed by {_fs.join(directory, STATE_FILE)} but its files are missing",))
        results.append(dataclasses.replace(result, **common))
    return VerifyReport(directory, FORMAT_DIRECTORY, True, tuple(results))


def verify(path: str, progress: Progress | None = None) -> VerifyReport:
    """Check that a checkpoint (or every checkpoint of a directory) is whole.

    Args:
        path: A TF prefix or ``.index`` file, a checkpoint or SavedModel directory, a V1 file,
            or a Keras ``.h5`` / ``.weights.h5`` / ``.keras`` file.
        progress: Called as ``progress(done, total, item)`` after each tensor or dataset;
            ``item.name`` names it.

    Returns:
        A :class:`VerifyReport`; damage is reported in it (``report.intact`` is False).

    Raises:
        CheckpointNotFoundError: Nothing at ``path``, or an index that cannot be read.
        NotACheckpointError: ``path`` is not a checkpoint (or is a part of one).
        UnsafeFileError: A Keras file asks for something unsafe (external links, zip bomb,
            path traversal).
    """
    path = str(path)
    kind, target = _classify(path)
    match kind:
        case Kind.TF_BUNDLE:
            if _fs.isdir(target + ".index"):
                raise NotACheckpointError(f"{target}.index: is a directory, not an index file")
            result = verify_bundle(target, progress=progress)
            return VerifyReport(path, m.FORMAT_TF_BUNDLE, False, (result,))
        case Kind.TF_SAVEDMODEL:
            from ..formats import SAVED_MODEL_VARIABLES  # noqa: PLC0415

            result = verify_bundle(_fs.join(target, SAVED_MODEL_VARIABLES), format=m.FORMAT_TF_SAVEDMODEL,
                                   progress=progress)
            return VerifyReport(path, m.FORMAT_TF_SAVEDMODEL, False, (result,))
        case Kind.TF_DIRECTORY:
            return _verify_directory(target, progress)
        case Kind.TF_V1:
            result = verify_v1(target)
            return VerifyReport(path, m.FORMAT_TF_V1, False, (result,))
        case Kind.HDF5 | Kind.ZIP | Kind.KERAS_SHARDED:
            result = verify_keras(target, progress)
            fallback = m.FORMAT_KERAS_ZIP if kind is Kind.ZIP else "hdf5"
            return VerifyReport(path, result.format or fallback, False, (result,))
    raise NotACheckpointError(f"{path}: not a checkpoint")  # pragma: no cover

