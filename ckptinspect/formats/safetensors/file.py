"""``.safetensors`` files (Hugging Face's format), read and written without the safetensors package.

Layout (the safetensors README, "Format"): an 8-byte little-endian header length ``N``, ``N``
bytes of UTF-8 JSON (``{"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin,
end]}, ..., "__metadata__": {"format": "pt"}}``), then the data buffer; offsets are relative
to the buffer. Writers pad the header with spaces to a multiple of 8, but not all do (the
tensor data of an unaligned header starts at an odd byte: values are read into fresh arrays).

Listing reads the header only. It is validated: bounded length (:data:`MAX_HEADER_BYTES`, as
the safetensors library), no duplicate names, known dtypes, ``data_offsets`` spans equal to
dtype size x shape, every span inside the file, no two spans overlapping. Values are read with
one bounded ``readinto`` per tensor (or streamed in blocks), bfloat16 and float8 through
ml_dtypes (the safetensors package's numpy API cannot return bfloat16).

Roles: every tensor is the model's, except 0-d integer counters (``step``, ``global_step``,
``epoch``...). ``__metadata__`` is shown in ``info``; a ``step`` entry there gives the step.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from ... import model as m
from ...errors import CheckpointNotFoundError, CorruptCheckpointError, NotACheckpointError, UnsafeFileError, one_line
from .. import _fs
from .._bulk import paused_gc
from .._lazymod import lazy_import
from .._readcheck import Opened, ReadCheck
from .._torch_layout import INT64_MAX, SAFETENSORS_HEADER_LENGTH, valid_dims

if TYPE_CHECKING:  # numpy is imported where values are read: listing goes without it
    import numpy as np

    from .compact import CompactHeader

# The columns reader of giant headers (its patterns compiled, its records made) loads for such a header only.
compact = lazy_import(__package__ + ".compact")

__all__ = [
    "FORMAT_SAFETENSORS",
    "MAX_HEADER_BYTES",
    "DTYPES",
    "open_safetensors",
    "check_safetensors",
    "read_header",
    "SafetensorsSource",
    "SafetensorsTensor",
    "write_safetensors",
]

FORMAT_SAFETENSORS = m.FORMAT_SAFETENSORS
HEADER_LENGTH = SAFETENSORS_HEADER_LENGTH
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's limit
METADATA_KEY = "__metadata__"
HEADER_ALIGNMENT = 8
READ_CHUNK_BYTES = 8 << 20
# Headers of this many bytes or more are read into columns (:mod:`.compact`); smaller ones by
# json.loads: the columns pay off on big ones.
COMPACT_MIN_BYTES = 1 << 20
MAX_DIMS = 64

# safetensors dtype -> ckptinspect dtype name (and back, for writing).
DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16",
    "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
}
CODES = {v: k for k, v in DTYPES.items()}
ITEMSIZE = {name: m.ITEMSIZE[name] for name in DTYPES.values()}
# Sub-byte and other dtypes of newer safetensors versions, listed by name but not read.
UNREADABLE_DTYPES = frozenset({"F4", "F6_E2M3", "F6_E3M2", "F8_E8M0"})
COUNTER_NAMES = frozenset({"step", "global_step", "epoch", "iteration", "iter", "iterations"})
STEP_METADATA_KEYS = ("step", "global_step", "epoch")


# -- the header ------------------------------------------------------------------------------------
class SafetensorsTensor(NamedTuple):
    """One header entry: where its bytes are in the file (a named tuple: a header holds thousands)."""

    name: str
    dtype: str  # ckptinspect name (float32...) or the raw code for unreadable ones
    shape: tuple[int, ...]
    start: int  # absolute file offset
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Header:
    """A parsed and validated header."""

    tensors: tuple[SafetensorsTensor, ...]
    metadata: dict[str, Any] | None
    header_bytes: int
    data_start: int
    file_size: int
    problems: dict[str, str]  # name -> why its bytes are not in the file (lenient reading)


def _no_duplicates(label: str) -> Callable[[list[tuple[str, Any]]], dict]:
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out = dict(pairs)
        if len(out) != len(pairs):  # a name given twice: say which one comes back first
            seen: set[str] = set()
            for k, _ in pairs:
                if k in seen:
                    raise CorruptCheckpointError(f"{label}: safetensors header names {k!r} twice")
                seen.add(k)
        return out

    return hook


def read_header(path: str, strict: bool = True) -> Header:
    """Read and validate the header of a safetensors file.

    Args:
        path: The file.
        strict: Raise when a tensor's bytes lie past the end of the file (else record it).

    Raises:
        CheckpointNotFoundError: No such file.
        CorruptCheckpointError: A damaged or truncated header, bad entries, overlapping data.
        UnsafeFileError: A header longer than :data:`MAX_HEADER_BYTES`.
    """
    return _header_from(path, *_read_raw(path), strict=strict)


def _header_from(path: str, raw: bytes, n: int, size: int, strict: bool) -> Header:
    """:func:`read_header` of the header's bytes."""
    header = _parse_header(raw, path)
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"{path}: safetensors header is not a JSON object")
    metadata = header.pop(METADATA_KEY, None)
    if metadata is not None and not isinstance(metadata, dict):
        raise CorruptCheckpointError(f"{path}: safetensors {METADATA_KEY} is not a JSON object")
    data_start = HEADER_LENGTH.size + n
    data_size = size - data_start
    tensors = []
    problems: dict[str, str] = {}
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise CorruptCheckpointError(f"{path}: safetensors entry {name!r} is not a JSON object")
        code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if code in DTYPES:
            dtype = DTYPES[code]
        elif code in UNREADABLE_DTYPES:
            dtype = str(code)
        else:
            raise CorruptCheckpointError(f"{path}: safetensors entry {name!r} has unknown dtype {_short(code, 40)}")
        if not isinstance(shape, list) or valid_dims(shape, MAX_DIMS) is None:
            raise CorruptCheckpointError(
                f"{path}: safetensors entry {name!r} has a bad shape {_short(shape)} (at most {MAX_DIMS} ints in"
                " [0, 2**63) whose product is below 2**63)")
        if (not isinstance(offsets, list) or len(offsets) != 2 or type(offsets[0]) is not int
                or type(offsets[1]) is not int or not 0 <= offsets[0] <= offsets[1] <= INT64_MAX):
            raise CorruptCheckpointError(f"{path}: safetensors entry {name!r} has bad data_offsets {_short(offsets)}")
        begin, end = offsets
        if dtype in ITEMSIZE:
            needed = math.prod(shape) * ITEMSIZE[dtype]
            if end - begin != needed:
                raise CorruptCheckpointError(
                    f"{path}: safetensors entry {name!r}: data_offsets [{begin}, {end}] span {end - begin} bytes,"
                    f" its {code} shape {shape} needs {needed}"
                )
        if end > data_size:
            problem = (f"{path}: safetensors entry {name!r} declares data up to byte {end} of the buffer, which holds"
                       f" {data_size} bytes (truncated, or a header claiming more than the file holds)")
            if strict:
                raise CorruptCheckpointError(problem)
            problems[name] = problem
        tensors.append(SafetensorsTensor(name, dtype, tuple(shape), data_start + begin, end - begin))
    spans = sorted((t.start, t.start + t.nbytes, t.name) for t in tensors if t.nbytes)
    for (b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CorruptCheckpointError(
                f"{path}: safetensors entries {n0!r} and {n1!r} overlap (bytes {b1 - data_start}..{e0 - data_start}"
                " of the buffer)"
            )
    return Header(tuple(tensors), metadata, n, data_start, size, problems)


def _read_raw(path: str) -> tuple[bytes, int, int]:
    """The header's bytes, its declared length and the file's size (bounded and checked)."""
    n, size = _header_size(path)
    return _fs.read_range(path, HEADER_LENGTH.size, n), n, size


def _header_size(path: str) -> tuple[int, int]:
    """The header's declared length and the file's size (bounded and checked)."""
    size = _fs.getsize(path) if _fs.exists(path) else None
    if size is None:
        raise CheckpointNotFoundError(f"{path}: no such file")
    head = _fs.read_range(path, 0, HEADER_LENGTH.size)
    if len(head) < HEADER_LENGTH.size:
        raise CorruptCheckpointError(f"{path}: {size} bytes, too short for a safetensors header")
    (n,) = HEADER_LENGTH.unpack(head)
    if n > MAX_HEADER_BYTES:
        raise UnsafeFileError(f"{path}: safetensors header declares {n} bytes (limit {MAX_HEADER_BYTES}); refusing")
    if HEADER_LENGTH.size + n > size:
        raise CorruptCheckpointError(
            f"{path}: safetensors header declares {n} bytes, the file has {size - HEADER_LENGTH.size} after the length"
            " (truncated)"
        )
    return n, size


def _parse_header(raw: bytes, path: str) -> Any:
    """The header's JSON, as :func:`load_json` with the duplicate-name check parses it, in C.

    The JSON's structure outside strings (its brackets and colons, kept by C code) bounds its
    depth, and its colons count its names: when the objects parsed hold as many names, none was
    given twice. A header that does not pass (deeper than two levels of objects, a name given
    twice, not JSON at all) is parsed again by :func:`load_json` with the check, which says what
    is wrong exactly as before.
    """
    structure = _structure(raw)
    if structure is not None:
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            header = None
        if type(header) is dict:
            objects, names = 1, len(header)
            for entry in header.values():
                if type(entry) is dict:
                    objects += 1
                    names += len(entry)
            if objects == structure.count(b"{") and names == structure.count(b":"):
                return header
    return load_json(raw, f"{path}: safetensors header", object_pairs_hook=_no_duplicates(path))


_STRUCTURE_DELETE = bytes(b for b in range(256) if b not in b'"[]{}:')


def _structure(raw: bytes) -> bytes | None:
    """The brackets and colons of a JSON text outside its strings (C code only), or None when
    they may nest deeper than :data:`MAX_JSON_DEPTH` (or are not balanced).

    Escaped backslashes and quotes go first (pairs, left to right, as JSON reads them), then
    everything but quotes, brackets and colons, then what lies between quotes.
    """
    kept = raw.replace(b"\\", b"").replace(b'\"', b"").translate(None, _STRUCTURE_DELETE)
    structure = b"".join(kept.split(b'"')[::2])
    brackets = structure.replace(b":", b"")
    for _ in range(MAX_JSON_DEPTH // 2):  # each pass takes at least one level off the deepest
        if not brackets:
            return structure
        brackets = brackets.replace(b"[]", b"").replace(b"{}", b"")
    return structure if not brackets else None


def _short(value: Any, limit: int = 80) -> str:
    """A header value for a message: its repr cut short (an int too long to print by its size)."""
    if isinstance(value, list) and len(value) > 16:
        value = value[:16]
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4,300 digits
        text = "<an int too long to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


MAX_JSON_DEPTH = 64  # a safetensors header or an index nests 3 levels; refuse far deeper ones early


def load_json(raw: bytes, what: str, **kw: Any) -> Any:
    """JSON from a file's bytes, as damage when it is not JSON or nests deeper than
    :data:`MAX_JSON_DEPTH` (checked before parsing: the parser recurses per level)."""
    depth = _json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise CorruptCheckpointError(f"{what} nests {depth} levels deep (limit {MAX_JSON_DEPTH}); not a valid header")
    try:
        return json.loads(raw.decode("utf-8"), **kw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, CorruptCheckpointError):
            raise
        raise CorruptCheckpointError(f"{what} is not valid JSON: {one_line(e)}") from None


# A JSON string, unrolled (runs of plain characters, then one escape at a time): a repeated
# group per character would make the regex engine keep state for every character.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` outside strings (strings dropped and the brackets
    kept by C code; the loop then runs over the brackets only, and stops past the limit)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return 0
    deepest = depth = 0
    for byte in _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS):
        if byte == 0x5B or byte == 0x7B:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
        else:
            depth -= 1
    return deepest


def _role(t: SafetensorsTensor) -> str:
    if t.shape == () and t.dtype in m.INTEGER_DTYPES \
            and t.name.replace("/", ".").rsplit(".", 1)[-1].lower() in COUNTER_NAMES:
        return m.ROLE_METADATA
    return m.ROLE_MODEL


def metadata_candidates(metadata: dict[str, Any] | None) -> dict[str, int]:
    """Every step-like number a ``__metadata__`` records (``step``, ``global_step``, ``epoch``),
    labelled for the step rule (``metadata:step``...)."""
    out: dict[str, int] = {}
    for key in STEP_METADATA_KEYS:
        value = (metadata or {}).get(key)
        if isinstance(value, (str, int)) and str(value).isdigit() and len(str(value)) < 20:
            out[f"metadata:{key}"] = int(value)
    return out


def metadata_step(metadata: dict[str, Any] | None) -> tuple[int | None, str | None]:
    """The first step-like number a ``__metadata__`` records, and its label, if any."""
    found = metadata_candidates(metadata)
    return next(((v, k) for k, v in found.items()), (None, None))


def variables_of(header: Header, shard: int | None = None) -> list[m.Variable]:
    """The variables of a header, in header (JSON) order."""
    shards = () if shard is None else (shard,)
    return [
        m.Variable(key=t.name, name=t.name, shape=t.shape, dtype=t.dtype, nbytes=t.nbytes, shards=shards, role=_role(t))
        for t in header.tensors
    ]


# -- values --------------------------------------------------------------------------------------
def numpy_dtype(name: str) -> np.dtype | None:
    """The numpy dtype of a dtype name read here (None when it cannot be read)."""
    return m.numpy_dtype(name)


class SafetensorsSource(m.BaseSource):
    """Reads tensors of one or more safetensors files (the shards of a sharded checkpoint).

    Args:
        paths: The files; ``entries`` refer to them by position.
        entries: key -> (file position, tensor entry).
        extra_files: Other files of the checkpoint (an index), reported by :meth:`files`.
        problems: key -> why its bytes cannot be read.
    """

    def __init__(self, paths: Sequence[str], entries: Mapping[str, tuple[int, SafetensorsTensor]],
                 extra_files: Sequence[str] = (), problems: dict[str, str] | None = None):
        self._paths = list(paths)
        self._entries = entries
        self._extra = tuple(extra_files)
        self._problems = problems or {}
        self._files: dict[int, Any] = {}

    def files(self) -> tuple[str, ...]:
        return (*self._extra, *self._paths)

    def _file(self, i: int) -> Any:
        if i not in self._files:
            try:
                self._files[i] = _fs.open_binary(self._paths[i])  # regular files only
            except OSError as e:
                raise CheckpointNotFoundError(f"{self._paths[i]}: cannot read: {one_line(e)}") from None
        return self._files[i]

    def close(self) -> None:
        files, self._files = self._files, {}
        for f in files.values():
            f.close()

    def storage_order(self, variable: m.Variable) -> tuple:
        i, t = self._entries[variable.key]
        return (i, t.start)

    def _lookup(self, variable: m.Variable) -> tuple[int, SafetensorsTensor, np.dtype]:
        if variable.key in self._problems:
            raise CorruptCheckpointError(self._problems[variable.key])
        found = self._entries.get(variable.key)  # one look-up (a table's is a search)
        if found is None:
            raise CheckpointNotFoundError(f"{self._paths[0]}: no tensor {variable.key!r}")
        i, t = found
        dtype = numpy_dtype(t.dtype)
        if dtype is None:
            raise CorruptCheckpointError(f"{self._paths[i]}: {t.name!r}: dtype {t.dtype} cannot be read")
        return i, t, dtype

    def _readinto(self, i: int, offset: int, view: memoryview, name: str) -> None:
        f = self._file(i)
        f.seek(offset)
        got = f.readinto(view)
        if got != len(view):
            raise CorruptCheckpointError(
                f"{self._paths[i]}: {name!r}: truncated: needed {len(view)} bytes at {offset}, got {got or 0}"
            )

    def read(self, variable: m.Variable) -> np.ndarray:
        """The value of ``variable`` in a fresh array."""
        import numpy as np  # noqa: PLC0415 - values only

        i, t, dtype = self._lookup(variable)
        out = np.empty(t.shape, dtype)
        if t.nbytes:
            self._readinto(i, t.start, memoryview(out.reshape(-1).view(np.uint8)), t.name)
        return out

    def iter_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        """The flattened value streamed through one reused buffer."""
        import numpy as np  # noqa: PLC0415 - values only

        i, t, dtype = self._lookup(variable)
        itemsize = dtype.itemsize
        step = max(1, min(elements, max(1, READ_CHUNK_BYTES // itemsize))) * itemsize
        buf = np.empty(max(1, min(step, t.nbytes)), np.uint8)
        pos = 0
        while pos < t.nbytes:
            n = min(step, t.nbytes - pos)
            self._readinto(i, t.start + pos, memoryview(buf)[:n], t.name)
            pos += n
            for j in range(0, n, elements * itemsize):
                yield buf[j : min(n, j + elements * itemsize)].view(dtype)


def _opened(path: str, strict: bool) -> tuple[m.Checkpoint, Header]:
    with paused_gc():
        return _opened_listing(path, strict)


def _opened_listing(path: str, strict: bool) -> tuple[m.Checkpoint, Header | CompactHeader]:
    n, size = _header_size(path)
    header: Header | CompactHeader | None = None
    if n >= COMPACT_MIN_BYTES:  # a giant header: read a window at a time into columns
        def read(offset: int, count: int) -> bytes:
            return _fs.read_range(path, HEADER_LENGTH.size + offset, min(count, n - offset))

        header = compact.scan_header(read, path, n, size, strict, DTYPES, UNREADABLE_DTYPES, COUNTER_NAMES,
                                     HEADER_LENGTH.size)
    if header is None:  # json.loads reads it
        header = _header_from(path, *_read_raw(path), strict=strict)
    step, step_source = metadata_step(header.metadata)
    info: dict[str, Any] = {"header_bytes": header.header_bytes}
    if header.metadata is not None:
        info["metadata"] = header.metadata
    candidates = metadata_candidates(header.metadata)
    if len(candidates) > 1:  # the step rule chooses (a step and an epoch: the step, the epoch as its number)
        info["step_candidates"] = candidates
    if header.data_start % HEADER_ALIGNMENT:
        info["data_alignment"] = f"unaligned (data starts at byte {header.data_start})"
    variables: Sequence[m.Variable]
    if not isinstance(header, Header):  # the columns
        variables = header.table
        entries: Mapping[str, tuple[int, SafetensorsTensor]] = _TableEntries(header.table, header.starts)
    else:
        variables = tuple(variables_of(header))
        entries = {t.name: (0, t) for t in header.tensors}
    source = SafetensorsSource([path], entries, problems=header.problems)
    ckpt = m.Checkpoint(path=path, format=FORMAT_SAFETENSORS, variables=variables, step=step,
                        step_source=step_source, num_shards=1, info=info, source=source)
    return ckpt, header


class _TableEntries(Mapping[str, tuple[int, SafetensorsTensor]]):
    """key -> (0, entry) of a header read into columns: each entry made when asked."""

    def __init__(self, table: m.VariableTable, starts: Any):
        self._table = table
        self._starts = starts

    def __getitem__(self, key: str) -> tuple[int, SafetensorsTensor]:
        r = self._table.find(key)
        if r is None:
            raise KeyError(key)
        t = self._table
        return 0, SafetensorsTensor(key, t.dtypes[t.dtype_codes[r]], t.shapes[t.shape_codes[r]],
                                    int(self._starts[r]), int(t.nbytes[r]))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._table.find(key) is not None

    def __iter__(self) -> Iterator[str]:
        return (v.key for v in self._table)

    def __len__(self) -> int:
        return len(self._table)


def open_safetensors(path: str) -> m.Checkpoint:
    """Open a ``.safetensors`` file (header only; values are read on demand).

    Raises:
        CheckpointNotFoundError, CorruptCheckpointError, UnsafeFileError: See :func:`read_header`.
    """
    return _opened(str(path), strict=True)[0]


def check_safetensors(path: str) -> ReadCheck:
    """Plan ``verify`` of a safetensors file: header, offsets, every tensor's bytes read."""

    def opener(p: str) -> Opened:
        ckpt, header = _opened(p, strict=False)
        damaged = [m.Damage(key=k, name=k, file=p, kind=m.DAMAGE_TRUNCATED, problem=problem.removeprefix(p + ": "))
                   for k, problem in header.problems.items()]
        return Opened(ckpt, damaged)

    return ReadCheck(str(path), opener)


# -- writing ---------------------------------------------------------------------------------------
def run_metadata(ckpt: m.Checkpoint) -> dict[str, str]:
    """The ``__metadata__`` entries that keep a checkpoint's place in its run when it is written
    as safetensors (read back by :func:`metadata_step` and the step rule): ``step`` for its
    training step, ``epoch`` for an epoch it records or carries in its name."""
    out: dict[str, str] = {}
    if ckpt.step is not None:
        out["step"] = str(ckpt.step)
    if ckpt.number is not None and (ckpt.number_source or "").endswith(":epoch"):
        out["epoch"] = str(ckpt.number)
    return out


def write_safetensors(
    path: str,
    tensors: Iterable[tuple[str, str, tuple[int, ...], Callable[[], np.ndarray]]],
    metadata: dict[str, str] | None = None,
) -> list[str]:
    """Write a safetensors file, one tensor in memory at a time.

    Args:
        path: The file to write (the caller makes it atomic).
        tensors: ``(name, dtype name, shape, read)`` in the order to store them; ``read()``
            returns the value (called once, while writing).
        metadata: ``__metadata__`` (string keys and values).

    Returns:
        The names written, in order.

    Raises:
        NotACheckpointError: A dtype safetensors cannot store (strings...), or a value whose
            shape or dtype differs from what was announced.
    """
    import numpy as np  # noqa: PLC0415 - values only

    entries = list(tensors)
    header: dict[str, Any] = {}
    if metadata:
        header[METADATA_KEY] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, dtype, shape, _ in entries:
        if dtype not in CODES:
            raise NotACheckpointError(f"{name}: dtype {dtype} cannot be stored in safetensors")
        nbytes = math.prod(shape) * ITEMSIZE[dtype]
        header[name] = {"dtype": CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-(len(raw) + HEADER_LENGTH.size) % HEADER_ALIGNMENT)
    with open(path, "wb") as f:
        f.write(HEADER_LENGTH.pack(len(raw)))
        f.write(raw)
        for name, dtype, shape, read in entries:
            value = np.asarray(read())
            expected = numpy_dtype(dtype)
            if tuple(value.shape) != tuple(shape) or value.dtype != expected:
                raise NotACheckpointError(
                    f"{name}: read {value.dtype}{list(value.shape)}, expected {dtype}{list(shape)}"
                )
            f.write(np.ascontiguousarray(value).reshape(-1).view(np.uint8).data)
            del value
        f.flush()
        os.fsync(f.fileno())
    return [e[0] for e in entries]
