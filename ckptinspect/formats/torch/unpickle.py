"""Reading the pickles of ``torch.save`` files without importing torch and without running code.

A ``torch.save`` file describes its tensors with a pickle: globals such as
``torch._utils._rebuild_tensor_v2`` and ``torch.FloatStorage``, called through ``REDUCE``, and
persistent ids ``('storage', <storage type>, <key>, <location>, <numel>)`` naming the raw
storages stored beside the pickle. The pickle runs in :class:`TorchMachine` (a
:class:`~.machine.Machine`: the opcodes run in Python, nesting, bytes built and numbers
bounded), never in CPython's unpickler. The globals ``torch.load(weights_only=True)`` accepts
(torch/_weights_only_unpickler.py, ``_get_allowed_globals``) resolve to local, inert functions
here that build a description (:class:`StorageRef`, :class:`TensorRef`) instead of a tensor.
Any other global becomes a :class:`StandInGlobal`: never imported, never called; calling it
gives a :class:`StandIn` recording its name, arguments and state (an ``argparse.Namespace`` of
hyper-parameters, a numpy scalar), and its name is listed in :attr:`Scan.needs` (what a plain
``torch.load(weights_only=True)`` would need through ``torch.serialization.add_safe_globals``).
Globals that run code (``os.system``, ``builtins.eval``, ``subprocess.*``, ``getattr``,
``importlib``, ``pickle.loads``...; :func:`runs_code`), torch globals outside the allow-list
and whole ``nn.Module`` objects still refuse the file with
:class:`~ckptinspect.errors.UnsafeFileError` naming them.

Before the pickle runs, :func:`scan` walks its opcodes (decoding nothing but lengths, memo
indices and global names) and refuses what a torch pickle never holds and what could exhaust
memory or time: the opcodes that instantiate through other paths (``INST``, ``OBJ``, ``EXT*``,
``NEWOBJ_EX``, protocol-5 buffers), memo indices out of sequence (a reader allocates up to the
largest index), more than :data:`MAX_OPCODES` opcodes and pickles larger than
:data:`MAX_PICKLE_BYTES`.
"""

from __future__ import annotations

import _compat_pickle
import dataclasses
import pickletools
import re
from collections import OrderedDict
from typing import Any, Callable

from ...errors import CkptError, CorruptCheckpointError, NotACheckpointError, UnsafeFileError
from .._torch_layout import INT64_MAX, valid_dims
from .machine import OBJECT_BYTES, SLOT_BYTES, Damaged, Machine, RanOut, Refused

__all__ = [
    "MAX_PICKLE_BYTES",
    "MAX_OPCODES",
    "StandIn",
    "StandInGlobal",
    "runs_code",
    "StorageRef",
    "TensorRef",
    "Scan",
    "scan",
    "unpickle",
    "TORCH_ITEMSIZE",
]

MAX_PICKLE_BYTES = 256 << 20  # a pickle (data.pkl) larger than this is refused
MAX_OPCODES = 4_000_000  # about 130,000 tensors; a pickle of more opcodes is refused
# What the objects a pickle builds may add up to (strings, bytes, containers, the results of
# calls): BUILT_PER_BYTE times its size plus BUILT_FLOOR, at most MAX_BUILT_BYTES.
BUILT_PER_BYTE = 16
BUILT_FLOOR = 16 << 20
MAX_BUILT_BYTES = 1 << 30
MAX_KEY_CHARS = 4096  # storage keys are short decimal strings
MAX_DIMS = 64

# Opcodes a torch pickle never uses are refused before unpickling (see ``_REFUSED`` below):
# other ways to instantiate (INST/OBJ call a class with arguments, EXT* go through the copyreg
# registry, NEWOBJ_EX passes keyword arguments), text persistent ids, protocol-5 buffers.

# Storage classes (``torch.FloatStorage``, ``torch.cuda.HalfStorage``...) -> dtype name.
STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128",
}
QUANTIZED_STORAGES = frozenset({"QInt8Storage", "QInt32Storage", "QUInt8Storage", "QUInt4x2Storage", "QUInt2x4Storage"})
UNTYPED_STORAGES = frozenset({"torch.storage.UntypedStorage", "torch.UntypedStorage", "torch.storage._UntypedStorage"})
STORAGE_RE = re.compile(r"^torch\.(?:cuda\.)?(\w+Storage)$")
# torch dtypes (``torch.float32`` globals, the ``dtype`` argument of _rebuild_tensor_v3).
TORCH_DTYPES = {
    "float64": "float64", "double": "float64", "float32": "float32", "float": "float32",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16", "int64": "int64", "long": "int64",
    "int32": "int32", "int": "int32", "int16": "int16", "short": "int16", "int8": "int8",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool",
    "complex64": "complex64", "cfloat": "complex64", "complex128": "complex128", "cdouble": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}
# torch dtypes torch.load accepts that have no numpy representation here.
OTHER_TORCH_DTYPES = frozenset({
    "complex32", "chalf", "qint8", "qint32", "quint8", "quint4x2", "quint2x4", "bits16", "bits1x8",
    "bits2x4", "bits4x2", "bits8", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", *(f"uint{i}" for i in range(1, 8)), *(f"int{i}" for i in range(1, 8)),
})
TORCH_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1, "complex64": 8,
    "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
TENSOR_CLASS_RE = re.compile(r"^torch\.(?:cuda\.)?\w*Tensor$")
LOCATION_RE = re.compile(r"^[A-Za-z_]\w*(?::\d+)?$")

# Rebuild functions torch.load accepts for tensors ckptinspect cannot describe by storage bytes.
UNSUPPORTED_REBUILDS = {
    "_rebuild_qtensor": "a quantized tensor",
    "_rebuild_sparse_tensor": "a sparse tensor",
    "_rebuild_meta_tensor_no_storage": "a meta tensor (no data)",
    "_rebuild_nested_tensor": "a nested tensor",
    "_rebuild_wrapper_subclass": "a tensor subclass without storage",
    "_rebuild_device_tensor_from_numpy": "a device tensor stored as a numpy array",
    "_rebuild_device_tensor_from_cpu_tensor": "a device tensor stored through a CPU copy",
}


# -- what the pickle describes ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StorageRef:
    """A raw storage the pickle names (its bytes live beside the pickle).

    Attributes:
        key: The storage key (``data/<key>`` in a zip, a key of the legacy storage list).
        dtype: Element type of the storage (``uint8`` for an untyped storage).
        location: Where it lived when saved (``cpu``, ``cuda:0``, ``mps``...); only bytes matter here.
        numel: Elements the pickle declares.
        byte_offset: For a legacy storage view, where the view starts in its root storage.
    """

    key: str
    dtype: str
    location: str
    numel: int
    byte_offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.numel * TORCH_ITEMSIZE[self.dtype]


@dataclasses.dataclass(frozen=True, eq=False)
class TensorRef:
    """A tensor the pickle describes: a strided view of a storage (identity matters: one object
    reached under two names is one tensor)."""

    storage: StorageRef
    dtype: str
    offset: int  # in elements of ``dtype``
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def byte_start(self) -> int:
        """First byte of the tensor in its (root) storage."""
        return self.storage.byte_offset + self.offset * TORCH_ITEMSIZE[self.dtype]

    @property
    def byte_span(self) -> int:
        """Bytes from :attr:`byte_start` to the end of the last element (0 when empty)."""
        if self.numel == 0:
            return 0
        last = sum((d - 1) * s for d, s in zip(self.shape, self.stride))
        return (last + 1) * TORCH_ITEMSIZE[self.dtype]

    @property
    def contiguous(self) -> bool:
        expected = 1
        for d, s in zip(reversed(self.shape), reversed(self.stride)):
            if d != 1 and s != expected:
                return False
            expected *= d
        return True


class DTypeRef(str):
    """A ``torch.<dtype>`` global: its dtype name."""


class TensorType(str):
    """A tensor class global (``torch.Tensor``, ``torch.nn.parameter.Parameter``...)."""


class PickledOrderedDict(OrderedDict):
    """``collections.OrderedDict`` as pickled by torch; BUILD state (``_metadata``) is kept
    aside as plain data."""

    def __setstate__(self, state: Any) -> None:
        self.pickled_state = state

    def __reduce__(self):  # pragma: no cover - never pickled again
        raise TypeError("not picklable")


class PickledCounter(dict):
    """``collections.Counter`` as plain data."""

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if args and isinstance(args[0], dict):
            self.update(args[0])

    def __setstate__(self, state: Any) -> None:
        pass


class _Refusal(Exception):
    """Raised inside the unpickler to stop it; turned into one of our errors outside (the
    message gets the file's name in front)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


class _UnsafeGlobal(Exception):
    """A global outside the allow-list: the unpickler stops before resolving it."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


# -- inert stand-ins for the allowed globals -----------------------------------------------------
def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages (never raises: an int too long
    to print, or an object whose repr fails, is named by its type)."""
    if type(value) is int and value.bit_length() > 256:
        return f"<an int of {value.bit_length()} bits>"
    if isinstance(value, (tuple, list)) and len(value) > 16:
        value = type(value)(value[:16])
    try:
        text = repr(value)
    except (ValueError, RecursionError, TypeError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shape(value: Any, what: str) -> tuple[int, ...]:
    out = valid_dims(value)
    if out is None:
        raise _Refusal(CorruptCheckpointError(
            f"tensor {what} {short_repr(value)} is not a tuple of at most {MAX_DIMS} ints in [0, 2**63)"
            " whose product is below 2**63"))
    return out


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: str | None = None) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise _Refusal(CorruptCheckpointError(f"a tensor's storage is {type(storage).__name__}, not a persistent storage"))
    if type(offset) is not int or not 0 <= offset <= INT64_MAX:
        raise _Refusal(CorruptCheckpointError(f"tensor storage offset {short_repr(offset, 40)} is not an int in [0, 2**63)"))
    shape, strides = _shape(size, "size"), _shape(stride, "stride")
    if len(shape) != len(strides):
        raise _Refusal(CorruptCheckpointError(f"tensor size {shape} and stride {strides} differ in length"))
    if 0 not in shape and sum((d - 1) * st for d, st in zip(shape, strides)) + offset > INT64_MAX:
        raise _Refusal(CorruptCheckpointError(f"tensor view (offset {offset}, size {shape}, stride {strides}) reaches past"
                                              " element 2**63"))
    dtype = dtype or storage.dtype
    return TensorRef(storage=storage, dtype=dtype, offset=offset, shape=shape, stride=strides)


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any) -> TensorRef:
    return _tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                       backward_hooks: Any = None, metadata: Any = None) -> TensorRef:
    return _tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any,
                       backward_hooks: Any, dtype: Any, metadata: Any = None) -> TensorRef:
    if not isinstance(dtype, DTypeRef):
        raise _Refusal(CorruptCheckpointError(f"_rebuild_tensor_v3 dtype {short_repr(dtype, 40)} is not a torch dtype"))
    if str(dtype) not in TORCH_ITEMSIZE:
        raise _Refusal(NotACheckpointError(f"holds a torch.{dtype} tensor, which ckptinspect cannot read"))
    return _tensor(storage, storage_offset, size, stride, str(dtype))


def _rebuild_parameter(data: Any, requires_grad: Any = True, backward_hooks: Any = None) -> Any:
    return data


def _rebuild_parameter_with_state(data: Any, requires_grad: Any, backward_hooks: Any, state: Any) -> Any:
    return data


_REBUILDERS = (_rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter, _rebuild_parameter_with_state)


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if func not in _REBUILDERS or not isinstance(new_type, TensorType) or not isinstance(args, tuple):
        raise _Refusal(CorruptCheckpointError("_rebuild_from_type_v2 with arguments torch.save does not write"))
    return func(*args)


class _Parameter:
    """``torch.nn.parameter.Parameter(data, requires_grad)`` (torch <= 0.3 pickles): the data."""

    def __new__(cls, data: Any = None, requires_grad: Any = True) -> Any:  # noqa: D102
        return data


def _size(*args: Any) -> tuple:
    if len(args) != 1 or not isinstance(args[0], (tuple, list)):
        raise _Refusal(CorruptCheckpointError("torch.Size with arguments torch.save does not write"))
    return tuple(args[0])


def _device(*args: Any) -> str:
    if not args or not isinstance(args[0], str) or len(args) > 2 or len(args[0]) > 64:
        raise _Refusal(CorruptCheckpointError("torch.device with arguments torch.save does not write"))
    if len(args) == 2 and args[1] is not None:
        return f"{args[0]}:{args[1]}"
    return args[0]


def _get_layout(name: Any) -> str:
    return str(name)[:64]


SAFE_ENCODINGS = frozenset({"latin1", "latin-1", "utf-8", "utf8", "ascii"})


def _encode(obj: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    """``_codecs.encode``: how protocol 2 pickles bytes (text codecs only)."""
    if not isinstance(obj, str) or encoding not in SAFE_ENCODINGS or errors != "strict":
        raise _Refusal(CorruptCheckpointError(f"_codecs.encode with encoding {short_repr(encoding, 40)}"))
    return obj.encode(encoding)


def _bytearray(*args: Any) -> bytearray:
    if not args:
        return bytearray()
    if isinstance(args[0], (bytes, bytearray)) and len(args) == 1:
        return bytearray(args[0])
    if isinstance(args[0], str) and len(args) == 2:
        return bytearray(_encode(args[0], args[1]))
    raise _Refusal(CorruptCheckpointError("bytearray with arguments pickle does not write"))


def _set(*args: Any) -> set:
    return set(*args[:1])


def _complex(*args: Any) -> complex:
    if not all(isinstance(a, (int, float)) for a in args) or len(args) > 2:
        raise _Refusal(CorruptCheckpointError("complex with arguments pickle does not write"))
    try:
        return complex(*args)
    except OverflowError:
        raise _Refusal(CorruptCheckpointError("complex of an int too large for a float")) from None


ALLOWED_GLOBALS: dict[str, Any] = {
    "collections.OrderedDict": PickledOrderedDict,
    "collections.Counter": PickledCounter,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter_with_state,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "torch.nn.parameter.Parameter": _Parameter,
    "torch.Size": _size,
    "torch.device": _device,
    "torch.serialization._get_layout": _get_layout,
    "_codecs.encode": _encode,
    "builtins.bytearray": _bytearray,
    "builtins.set": _set,
    "builtins.complex": _complex,
}


class _StorageType(str):
    """A storage class global: the dtype name of its elements."""


# -- globals outside the allow-list --------------------------------------------------------------
class StandInGlobal:
    """A global outside the allow-list that does not run code: its name only (never imported).
    ``callable`` False: a torch global, which may be kept as a value (a loss function in the
    hyper-parameters) but not called (it would build something ckptinspect cannot describe)."""

    __slots__ = ("name", "callable")

    def __init__(self, name: str, callable: bool = True):
        self.name = name
        self.callable = callable

    def __repr__(self) -> str:
        return f"<global {self.name}>"


@dataclasses.dataclass(eq=False)
class StandIn:
    """What calling a :class:`StandInGlobal` would have made, never made: the global's name,
    the arguments (``REDUCE``, or ``NEWOBJ`` when ``new``), ``BUILD``'s state and the items
    ``SETITEM(S)``/``APPEND(S)`` put into it (a dict or list subclass)."""

    name: str
    args: tuple
    new: bool = False
    state: Any = None
    items: dict | None = None
    elements: list | None = None


# Modules whose globals run code when torch.load calls them (the top-level package is matched),
# names that run code in any module, and the builtins that are inert types.
CODE_MODULES = frozenset({
    "os", "posix", "nt", "subprocess", "sys", "importlib", "imp", "pickle", "_pickle", "marshal", "code", "codeop",
    "types", "shutil", "socket", "runpy", "ctypes", "pty", "pdb", "bdb", "operator", "_operator", "io", "_io",
    "pathlib", "tempfile", "multiprocessing", "threading", "_thread", "asyncio", "signal", "gc", "inspect",
    "webbrowser", "commands", "popen2", "platform", "pip", "setuptools", "distutils", "site", "sysconfig", "timeit",
    "trace", "cProfile", "profile", "doctest", "unittest", "zipimport", "pkgutil", "dill", "cloudpickle", "joblib",
    "shelve", "dbm", "sqlite3", "urllib", "http", "ftplib", "smtplib", "telnetlib", "xmlrpc", "ssl", "select",
    "selectors", "mmap", "resource", "fcntl", "termios", "atexit", "weakref", "copy", "codecs", "_codecs",
    "builtins", "_posixsubprocess", "_winapi", "msvcrt", "winreg", "ensurepip", "venv", "zipapp", "idlelib",
    "tkinter", "turtle", "nturl2path", "yaml", "jsonpickle", "numexpr", "pandas.io", "sympy", "IPython",
})
CODE_NAMES = frozenset({
    "eval", "exec", "execfile", "compile", "system", "popen", "__import__", "getattr", "setattr", "delattr",
    "import_module", "load", "loads", "unsafe_load", "full_load", "fork", "open", "globals", "locals", "vars",
    "breakpoint", "input", "reload", "attrgetter", "methodcaller",
})
CODE_NAME_PREFIXES = ("exec", "spawn", "popen", "system", "__")
INERT_BUILTINS = frozenset({
    "object", "int", "float", "str", "bytes", "bool", "list", "dict", "tuple", "frozenset", "slice", "range",
    "NoneType", "Ellipsis", "NotImplemented",
})


# torch globals refused even as values: modules (a whole model), tensors and storages rebuilt in
# ways ckptinspect does not read, serialization, TorchScript, packages, the hub.
TORCH_REFUSED_PREFIXES = (
    "torch.nn.modules.", "torch.nn.backends.", "torch._utils.", "torch._tensor.", "torch.storage.",
    "torch.serialization.", "torch.jit.", "torch._C.", "torch.package.", "torch.hub.", "torch.utils.",
    "torch._ops.", "torch.ops.", "torch.fx.", "torch._dynamo.", "torch._inductor.", "torch.multiprocessing.",
    "torch.distributed.", "torch.library.", "torch.load", "torch.save", "torch.Tensor", "torch.tensor",
    "torch.from_numpy", "torch.as_tensor", "torch.frombuffer", "torch.classes.", "torch._classes.",
)


def runs_code(full: str) -> bool:
    """Whether a global outside the allow-list would run code if ``torch.load`` called it (such
    files are refused; the others' globals become inert stand-ins)."""
    module, _, name = full.rpartition(".")
    if module == "builtins":
        return name not in INERT_BUILTINS
    top = module.split(".", 1)[0]
    if top in CODE_MODULES or module in CODE_MODULES:
        return True
    return name in CODE_NAMES or name.startswith(CODE_NAME_PREFIXES) or not name.isidentifier()


def resolve_global(full: str) -> Any:
    """The inert stand-in for a global: an allowed one's local function or type, a
    :class:`StandInGlobal` for one that runs no code; raise :class:`_Refusal` or
    :class:`_UnsafeGlobal` otherwise.

    Args:
        full: ``module.name`` after Python 2 name fixes.
    """
    if full in ALLOWED_GLOBALS:
        return ALLOWED_GLOBALS[full]
    if full in UNTYPED_STORAGES:
        return _StorageType("uint8")
    m = STORAGE_RE.match(full)
    if m and m.group(1) in STORAGE_DTYPES:
        return _StorageType(STORAGE_DTYPES[m.group(1)])
    if m and m.group(1) in QUANTIZED_STORAGES:
        raise _Refusal(NotACheckpointError(f"holds quantized storages ({full}), which ckptinspect cannot read"))
    if full.startswith("torch."):
        short = full[len("torch."):]
        if short in TORCH_DTYPES:
            return DTypeRef(TORCH_DTYPES[short])
        if short in OTHER_TORCH_DTYPES:
            return DTypeRef(short)
        if full.startswith("torch._utils.") and full[len("torch._utils."):] in UNSUPPORTED_REBUILDS:
            what = UNSUPPORTED_REBUILDS[full[len("torch._utils."):]]
            raise _Refusal(NotACheckpointError(f"holds {what} ({full}), which ckptinspect cannot read"))
        if full == "torch.Tensor" or full == "torch.nn.parameter.Parameter" or TENSOR_CLASS_RE.match(full):
            return TensorType(full)
        if full.startswith(TORCH_REFUSED_PREFIXES) or runs_code(full):
            raise _UnsafeGlobal(full)  # a whole model, tensors rebuilt in other ways, torch.load...
        return StandInGlobal(full, callable=False)
    if runs_code(full):
        raise _UnsafeGlobal(full)
    return StandInGlobal(full)


# -- the pre-scan ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Scan:
    """What the opcode walk found.

    Attributes:
        end: Offset just past the pickle's STOP opcode.
        globals: Every ``module.name`` the pickle names with GLOBAL (and STACK_GLOBAL where the
            names are literal strings), in order of first appearance.
        opcodes: Number of opcodes.
    """

    end: int
    globals: tuple[str, ...]
    opcodes: int
    needs: tuple[str, ...] = ()


class IncompletePickle(CorruptCheckpointError):
    """The bytes end before the pickle does (more bytes could complete it).

    Attributes:
        needed: How many bytes from the pickle's start would hold the opcode that ran out, when
            known (a declared length), else None.
    """

    def __init__(self, message: str, needed: int | None = None):
        super().__init__(message)
        self.needed = needed


def _fix_name(module: str, name: str) -> tuple[str, str]:
    """Python 2 names as the default unpickler maps them (``__builtin__.set`` -> ``builtins.set``)."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


# The opcode walk, table-driven (pickletools.genops decodes every argument into Python objects
# and is several times slower). Per opcode byte: how its argument is laid out, from pickletools'
# own description of the opcodes.
def _opcode_tables() -> tuple[dict[int, int], dict[int, tuple[int, bool]], dict[int, int], frozenset[int]]:
    """From pickletools' opcode table: fixed-size arguments, counted ones (length bytes,
    signed), newline-terminated ones (how many lines), and opcodes without an argument."""
    fixed: dict[int, int] = {}
    counted: dict[int, tuple[int, bool]] = {}
    lines: dict[int, int] = {}
    bare = set()
    counts = {pickletools.TAKEN_FROM_ARGUMENT1: (1, False), pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
              pickletools.TAKEN_FROM_ARGUMENT4U: (4, False), pickletools.TAKEN_FROM_ARGUMENT8U: (8, False)}
    for info in pickletools.opcodes:
        code = ord(info.code.encode("latin-1"))
        if info.arg is None:
            bare.add(code)
        elif info.arg.n >= 0:
            fixed[code] = info.arg.n
        elif info.arg.n == pickletools.UP_TO_NEWLINE:
            lines[code] = 2 if info.name in ("GLOBAL", "INST") else 1
        else:
            counted[code] = counts[info.arg.n]
    return fixed, counted, lines, frozenset(bare)


_FIXED, _COUNTED, _LINES, _BARE = _opcode_tables()
_REFUSED = {ord(info.code.encode("latin-1")): info.name for info in pickletools.opcodes if info.name in {
    "INST", "OBJ", "EXT1", "EXT2", "EXT4", "NEWOBJ_EX", "PERSID", "BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER"}}
_PUTS = {ord("q"), ord("r"), ord("p"), 0x94}
_GETS = {ord("h"), ord("j"), ord("g")}
_TEXTS = {ord("X"), 0x8C, 0x8D}
_STOP, _GLOBAL, _STACK_GLOBAL, _MEMOIZE = ord("."), ord("c"), 0x93, 0x94


def scan(data: bytes | memoryview, start: int = 0, label: str = "pickle") -> Scan:
    """Walk one pickle's opcodes without building anything.

    Args:
        data: The bytes holding the pickle (more may follow).
        start: Where it starts.
        label: How messages name it.

    Raises:
        UnsafeFileError: An opcode torch never writes, memo indices out of sequence, or more
            than :data:`MAX_OPCODES` opcodes.
        IncompletePickle: The bytes end before the pickle does.
        CorruptCheckpointError: Not a pickle (an unknown opcode).
    """
    data = bytes(data) if not isinstance(data, bytes) else data
    size = len(data)
    pos = start
    found: dict[str, None] = {}
    puts = 0
    count = 0
    last: list[str | None] = [None, None]  # the last two values pushed, when they are literal text
    memo_text: dict[int, str] = {}
    fixed, counted, lines, bare = _FIXED, _COUNTED, _LINES, _BARE
    while pos < size:
        op = data[pos]
        at = pos
        pos += 1
        count += 1
        if count > MAX_OPCODES:
            raise UnsafeFileError(f"{label}: the pickle has more than {MAX_OPCODES} opcodes; refusing")
        text = None
        if op in _REFUSED:
            raise UnsafeFileError(f"{label}: pickle opcode {_REFUSED[op]} at byte {at}, which torch.save never writes; refusing")
        if op in bare:
            if op == _STOP:
                return Scan(end=pos, globals=tuple(found), opcodes=count)
            if op == _STACK_GLOBAL and last[0] is not None and last[1] is not None:
                found.setdefault(f"{last[0]}.{last[1]}", None)
            elif op == _MEMOIZE:
                if last[1] is not None:
                    memo_text[puts] = last[1]
                puts += 1
                continue
        elif op in fixed:
            n = fixed[op]
            if pos + n > size:
                break
            if op in _PUTS or op in _GETS:
                index = int.from_bytes(data[pos : pos + n], "little")
                if op in _PUTS:
                    if index > puts:
                        raise UnsafeFileError(
                            f"{label}: pickle memo index {index} at byte {at} is out of sequence ({puts} entries so"
                            " far); refusing a possible memory bomb"
                        )
                    if last[1] is not None:
                        memo_text[index] = last[1]
                    puts += 1
                    pos += n
                    continue
                text = memo_text.get(index)
            pos += n
        elif op in counted:
            n, signed = counted[op]
            if pos + n > size:
                break
            length = int.from_bytes(data[pos : pos + n], "little", signed=signed)
            pos += n
            if length < 0:
                raise CorruptCheckpointError(f"{label}: damaged pickle: opcode at byte {at} declares {length} bytes")
            if pos + length > size:
                raise IncompletePickle(
                    f"{label}: not a complete pickle: opcode at byte {at} declares {length} bytes, {size - pos} remain",
                    needed=pos + length - start)
            if op in _TEXTS and length <= 256:
                text = data[pos : pos + length].decode("utf-8", "replace")
            pos += length
        elif op in lines:
            parts = []
            for _ in range(lines[op]):
                end = data.find(b"\n", pos)
                if end < 0:
                    raise IncompletePickle(f"{label}: not a complete pickle: no newline after byte {at}")
                parts.append(data[pos:end])
                pos = end + 1
            if op == _GLOBAL:
                module, name = (x.decode("utf-8", "replace") for x in parts)
                found.setdefault(".".join(_fix_name(module, name)), None)
            elif op == ord("p"):
                index = int(parts[0]) if parts[0].strip().isdigit() else -1
                if not 0 <= index <= puts:
                    raise UnsafeFileError(
                        f"{label}: pickle memo index {parts[0][:20]!r} at byte {at} is out of sequence ({puts} entries so"
                        " far); refusing a possible memory bomb"
                    )
                puts += 1
                continue
        else:
            raise CorruptCheckpointError(f"{label}: not a complete pickle: unknown opcode {op:#04x} at byte {at}")
        last[0], last[1] = last[1], text
    raise IncompletePickle(f"{label}: not a complete pickle (no STOP opcode in {size - start} bytes)",
                           needed=None if pos <= size else pos - start)


WHOLE_MODULE_PREFIXES = ("torch.nn.modules.", "torch.nn.backends.")


def refusal_message(label: str, name: str, globals_seen: tuple[str, ...] = ()) -> str:
    """The one line refusing a pickle that would call ``name``."""
    message = (
        f"{label}: refusing to unpickle: it would call {name}, which is not a tensor, storage or"
        " container that torch.load(weights_only=True) accepts (nothing was run)"
    )
    if name.startswith(WHOLE_MODULE_PREFIXES) or any(g.startswith(WHOLE_MODULE_PREFIXES) for g in globals_seen):
        message += "; this is a whole model saved with torch.save(model): save model.state_dict() instead"
    return message


# -- the unpickler -----------------------------------------------------------------------------
PersistentLoad = Callable[[Any], Any]
_MADE_BY_CALLS = frozenset(ALLOWED_GLOBALS.values())
_REBUILDS = frozenset({_rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter,
                       _rebuild_parameter_with_state, _rebuild_from_type_v2, _Parameter})
_COPYING_CALLS = _MADE_BY_CALLS - _REBUILDS  # calls whose result copies their arguments
_HASHING_CALLS = frozenset({PickledOrderedDict, PickledCounter, _set})
_DICT_TYPES = (PickledOrderedDict, PickledCounter)
_HOLDERS = (tuple, list, dict, set, frozenset, StandIn)  # results that hold other objects


HASHED_SLOT_BYTES = 104  # what one entry of a dict or set a call builds costs (table, links)


def _cost(value: Any, hashed: bool = False) -> int:
    """Bytes a call on ``value`` may materialise from it (copying it, encoding it; ``hashed``:
    into a dict or set)."""
    if isinstance(value, str):
        return len(value) * (1 if value.isascii() else 4)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, (tuple, list, dict, set, frozenset)):
        return len(value) * (HASHED_SLOT_BYTES if hashed else SLOT_BYTES)
    return 0


def _what(inst: Any) -> str:
    if isinstance(inst, TensorRef):
        return "a tensor"
    if isinstance(inst, StorageRef):
        return "a storage"
    if isinstance(inst, StandInGlobal):
        return f"the global {inst.name}"
    return f"a {type(inst).__name__}"


class TorchMachine(Machine):
    """The pickle machine with torch's rules: allowed globals to local stand-ins, other inert
    globals to :class:`StandInGlobal`, calls only of those, ``BUILD`` only of what torch would
    build (an ``OrderedDict``'s metadata, a stand-in's state)."""

    def __init__(self, data: bytes, start: int, persistent_load: PersistentLoad):
        size = min(len(data) - start, MAX_PICKLE_BYTES)
        super().__init__(data, start, min(BUILT_PER_BYTE * size + BUILT_FLOOR, MAX_BUILT_BYTES), MAX_PICKLE_BYTES,
                         MAX_OPCODES)
        self._persistent = persistent_load
        self.needs: dict[str, None] = {}

    def find_class(self, module: str, name: str) -> Any:
        module, name = _fix_name(module, name)
        self.globals.setdefault(f"{module}.{name}", None)
        found = resolve_global(f"{module}.{name}")
        if isinstance(found, StandInGlobal):
            self.needs.setdefault(found.name, None)
        return found

    def persistent_load(self, pid: Any) -> Any:
        return self._persistent(pid)

    def _made(self, result: Any, args: tuple) -> Any:
        """A call's result holds its arguments: as deep as their tuple (a tensor, a string... is a leaf)."""
        if isinstance(result, _HOLDERS):
            self.set_depth(result, max(self.depth(args), 1))
        return result

    def call(self, func: Any, args: tuple) -> Any:
        if type(func) is StandInGlobal:
            if not func.callable:
                raise _UnsafeGlobal(func.name)
            self.charge(OBJECT_BYTES)
            return self._made(StandIn(func.name, args), args)
        if func not in _MADE_BY_CALLS:
            raise Damaged(f"REDUCE of {_what(func)}, which is not callable here")
        if func in _COPYING_CALLS:  # charged before the call materialises it
            hashed = func in _HASHING_CALLS
            self.charge(OBJECT_BYTES + sum(_cost(a, hashed) for a in args))
        try:
            result = func(*args)
        except (TypeError, ValueError, OverflowError) as e:
            if isinstance(e, CkptError):
                raise
            raise Damaged(f"{getattr(func, '__name__', 'a call')} with arguments torch.save does not write") from None
        return self._made(result, args)

    def new(self, cls: Any, args: tuple) -> Any:
        if isinstance(cls, StandInGlobal):
            if not cls.callable:
                raise _UnsafeGlobal(cls.name)
            self.charge(OBJECT_BYTES)
            return self._made(StandIn(cls.name, args, new=True), args)
        if cls in _DICT_TYPES and not args:
            return self._made(cls(), args)
        raise Damaged(f"NEWOBJ of {_what(cls)}")

    def build(self, inst: Any, state: Any) -> None:
        if type(inst) is StandIn:
            self.grow(inst, [state])
            inst.state = state
        elif type(inst) is PickledOrderedDict:
            self.grow(inst, [state])
            inst.pickled_state = state
        elif type(inst) is not PickledCounter:
            raise Refused(f"pickle BUILD of {_what(inst)}, which torch.load(weights_only=True) would not build;"
                          " refusing")

    def set_items(self, target: Any, pairs: list[tuple[Any, Any]]) -> None:
        if type(target) is not StandIn:
            raise Damaged(f"SETITEM on {_what(target)}")
        self.grow(target, [x for pair in pairs for x in pair])
        if target.items is None:
            target.items = {}
        try:
            for k, v in pairs:
                target.items[k] = v
        except TypeError as e:
            raise Damaged(f"a dict key that cannot be one: {e}") from None

    def append_items(self, target: Any, items: list[Any]) -> None:
        if type(target) is not StandIn:
            raise Damaged(f"APPEND on {_what(target)}")
        self.grow(target, items)
        if target.elements is None:
            target.elements = []
        target.elements.extend(items)


def unpickle(data: bytes | memoryview, persistent_load: PersistentLoad, label: str, start: int = 0) -> tuple[Any, Scan]:
    """Run one pickle of ``data`` (starting at ``start``) in :class:`TorchMachine`: no code of
    the file's is run, and every bound applies while it runs (one pass: no separate scan).

    Args:
        data: The bytes.
        persistent_load: Called with each persistent id (a storage tuple); returns what stands
            for it. Raise :class:`~ckptinspect.errors.CkptError` to refuse.
        label: How messages name the pickle.
        start: Its offset in ``data``.

    Returns:
        (the object, a :class:`Scan`: where it ends, its globals and opcode count, the stand-in
        globals it needs).

    Raises:
        UnsafeFileError: A global that runs code or a torch global outside the allow-list (the
            message names it), an opcode torch never writes, a BUILD torch would not do, or a
            bomb (nesting, memory, opcodes, size).
        IncompletePickle: The bytes end before the pickle does.
        CorruptCheckpointError, NotACheckpointError: A damaged pickle or an unsupported tensor.
    """
    data = bytes(data) if not isinstance(data, bytes) else data
    machine = TorchMachine(data, start, persistent_load)
    try:
        obj = machine.run()
    except _UnsafeGlobal as g:
        raise UnsafeFileError(refusal_message(label, g.name, _all_globals(data, start, label, machine))) from None
    except _Refusal as r:
        raise type(r.error)(f"{label}: {r.error}") from None
    except Refused as r:
        raise UnsafeFileError(f"{label}: {r}") from None
    except RanOut as r:
        raise IncompletePickle(f"{label}: {r}", r.needed) from None
    except Damaged as d:
        raise CorruptCheckpointError(f"{label}: damaged pickle: {d}") from None
    except RecursionError:
        raise UnsafeFileError(f"{label}: pickle nests too deeply; refusing") from None
    except MemoryError:
        raise UnsafeFileError(f"{label}: pickle needs more memory than its size allows; refusing") from None
    found = Scan(end=machine.end, globals=tuple(machine.globals), opcodes=machine.opcodes, needs=tuple(machine.needs))
    return obj, found


def _all_globals(data: bytes, start: int, label: str, machine: TorchMachine) -> tuple[str, ...]:
    """Every global the pickle names, those after a refused one too (for the whole-model hint)."""
    try:
        return tuple(dict.fromkeys([*machine.globals, *scan(data[start : start + MAX_PICKLE_BYTES], 0, label).globals]))
    except CkptError:
        return tuple(machine.globals)
