"""Naming what a ``torch.save`` pickle holds: nested dicts and lists flattened to ``a/b/c``
variables, roles from the structure, the step, tied tensors.

Nested dicts and lists become ``a/b/c`` names (``model_state_dict/fc.weight``,
``optimizer_state_dict/state/0/exp_avg``); Python numbers become 0-d variables (lists of
numbers 1-d); short strings are kept for ``info``. Roles: under ``optimizer_state_dict``,
``optimizer_states``... (or in a ``{state, param_groups}`` dict) the optimizer; Python numbers
elsewhere metadata; tensors the model's, except, when the top level has a model key
(``state_dict``, ``model_state_dict``...), those outside it (metadata). The step comes from
``global_step``, ``step``... or ``epoch``. Two names of one view of one storage are ``tied``.

The walk is iterative and bounded: at most :data:`MAX_DEPTH` levels, and at most
:data:`ENTRIES_PER_OPCODE` entries per pickle opcode (plus :data:`MIN_ENTRIES`, and never more
than :data:`MAX_ENTRIES`): a container shared through the pickle memo counts each time it is
reached, which is how a "billion laughs" pickle would expand.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ... import model as m
from ...errors import UnsafeFileError
from .._lazymod import lazy_import
from .._torch_layout import valid_dims
from .unpickle import TORCH_ITEMSIZE, StandIn, StorageRef, TensorRef

# numpy loads when a number that is not a tensor is met (epoch, loss...; see _lazymod).
np = lazy_import("numpy")

__all__ = ["Flat", "flatten", "OPTIMIZER_KEYS", "MODEL_KEYS", "STEP_KEYS"]

MAX_DEPTH = 200
MAX_ENTRIES = 1_000_000
ENTRIES_PER_OPCODE = 4
MIN_ENTRIES = 10_000
MAX_INFO_STRINGS = 64
MAX_INFO_STRING_CHARS = 200

# Structure -> roles.
OPTIMIZER_KEYS = frozenset({
    "optimizer", "optimizers", "optimizer_state_dict", "optimizer_states", "optimizer_state", "optim",
    "optim_state", "optim_state_dict", "opt", "opt_state", "scheduler", "schedulers", "lr_scheduler",
    "lr_schedulers", "scheduler_state_dict", "lr_scheduler_state_dict", "scaler", "grad_scaler", "amp",
})
MODEL_KEYS = frozenset({
    "state_dict", "model_state_dict", "model", "model_state", "module", "net", "network", "ema",
    "model_ema", "ema_state_dict", "generator", "discriminator", "params", "weights",
})
COUNTER_KEYS = frozenset({"epoch", "step", "global_step", "iteration", "iter", "iter_num", "loss", "best_loss"})
STEP_KEYS = ("global_step", "step", "iteration", "iter_num", "iter", "epoch")
OPTIMIZER_STRUCTURE = frozenset({"state", "param_groups"})
TOP_TENSOR_NAME = "tensor"
INT64_RANGE = (-(1 << 63), (1 << 63) - 1)


# -- flattening the unpickled object -----------------------------------------------------------
@dataclasses.dataclass
class Flat:
    """The variables a torch object holds.

    Attributes:
        variables: In pickle order.
        tensors: key -> the tensor it names.
        values: key -> the value of a Python number (or list of numbers).
        strings: Short string values by name (shown in ``info``).
        step, step_source: The step and where it came from.
        tied: Groups of keys naming the same view of the same storage.
        model_prefix: ``<key>/`` when every model tensor lies under one top-level model key
            (``model_state_dict/``): their state_dict keys follow it.
    """

    variables: list[m.Variable]
    tensors: dict[str, TensorRef]
    values: dict[str, np.ndarray]
    strings: dict[str, str]
    step: int | None
    step_source: str | None
    tied: list[list[str]]
    model_prefix: str | None = None


def _key_text(k: Any) -> str:
    if isinstance(k, bytes):
        return k.decode("utf-8", "replace")
    if isinstance(k, (str, int, float, bool)) or k is None:
        return str(k)
    return f"<{type(k).__name__}>"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _number_array(values: Any) -> np.ndarray | None:
    """A Python number (or list/tuple of numbers) as int64/float64/bool, None if it does not fit."""
    if isinstance(values, bool):
        return np.asarray(values)
    if isinstance(values, int):
        return np.asarray(values, np.int64) if INT64_RANGE[0] <= values <= INT64_RANGE[1] else None
    if isinstance(values, float):
        return np.asarray(values, np.float64)
    if all(isinstance(x, int) for x in values):
        if not all(INT64_RANGE[0] <= x <= INT64_RANGE[1] for x in values):
            return None
        return np.asarray(values, np.int64)
    return np.asarray(values, np.float64)


# numpy values pickled through stand-ins: numpy.dtype(code, align, copy) with BUILD state
# (version, byte order, ...), numpy scalars (dtype, bytes) and arrays (_reconstruct + BUILD state
# (version, shape, dtype, fortran, bytes)). Only plain numeric codes are decoded; nothing is
# called but numpy.frombuffer on the bytes.
NUMPY_MODULES = ("numpy.core.multiarray.", "numpy._core.multiarray.")
NUMPY_CODE_RE = re.compile(r"^(?:[fiu][1248]|f2|c8|c16|b1|\?)$")
MAX_NUMPY_ARRAY_BYTES = 64 << 20


def _numpy_dtype(value: Any) -> Any:
    """The numpy dtype a ``numpy.dtype`` stand-in describes, or None."""
    if not (isinstance(value, StandIn) and value.name == "numpy.dtype" and value.args
            and isinstance(value.args[0], str) and NUMPY_CODE_RE.match(value.args[0])):
        return None
    order = "<"
    if isinstance(value.state, tuple) and len(value.state) > 1 and value.state[1] in ("<", ">", "|", "="):
        order = value.state[1] if value.state[1] in ("<", ">") else "<"
    code = "?" if value.args[0] in ("?", "b1") else value.args[0]
    return np.dtype(order + code)


def _little(arr: np.ndarray) -> np.ndarray:
    return arr.astype(arr.dtype.newbyteorder("<")) if arr.dtype.byteorder == ">" else arr


def numpy_value(value: StandIn) -> np.ndarray | None:
    """A numpy scalar or array a stand-in records, decoded from its bytes (a copy), or None."""
    name = value.name
    if not name.startswith(NUMPY_MODULES):
        return None
    short = name.rsplit(".", 1)[1]
    if short == "scalar" and len(value.args) == 2 and isinstance(value.args[1], (bytes, bytearray)):
        dtype = _numpy_dtype(value.args[0])
        if dtype is not None and dtype.itemsize == len(value.args[1]):
            return _little(np.frombuffer(bytes(value.args[1]), dtype).reshape(()).copy())
    if short == "_reconstruct" and isinstance(value.state, tuple) and len(value.state) == 5:
        _, shape, dt, fortran, raw = value.state
        dtype = _numpy_dtype(dt)
        dims = valid_dims(shape)
        if dtype is None or dims is None or not isinstance(raw, (bytes, bytearray)) or len(raw) > MAX_NUMPY_ARRAY_BYTES:
            return None
        count = 1
        for d in dims:
            count *= d
        if count * dtype.itemsize != len(raw):
            return None
        arr = np.frombuffer(bytes(raw), dtype).reshape(dims, order="F" if fortran is True else "C")
        return _little(np.ascontiguousarray(arr))
    return None


def _stand_in_children(value: StandIn) -> list[tuple[str, Any]]:
    """What a stand-in holds, by name: the items put into it, its BUILD state (a dict's entries,
    a ``(dict, slots)`` pair's both), else its arguments by index."""
    out: list[tuple[str, Any]] = []
    if value.items:
        out += [(_key_text(k), v) for k, v in value.items.items()]
    if value.elements:
        out += [(str(i), v) for i, v in enumerate(value.elements)]
    state = value.state
    if isinstance(state, tuple) and len(state) == 2 and all(isinstance(x, dict) or x is None for x in state):
        for part in state:
            out += [(_key_text(k), v) for k, v in (part or {}).items()]
    elif isinstance(state, dict):
        out += [(_key_text(k), v) for k, v in state.items()]
    elif state is not None:
        out.append(("state", state))
    if not out:
        out = [(str(i), v) for i, v in enumerate(value.args)]
    return out


def _dtype_name(arr: np.ndarray) -> str:
    return "bool" if arr.dtype == np.bool_ else str(arr.dtype)


class _Walk:
    """One walk of an unpickled object: the names it gives, the variables and values found."""

    def __init__(self, obj: Any, label: str, limit: int):
        top_keys = {str(k).lower() for k in obj} if isinstance(obj, dict) else set()
        self.has_model_key = bool(top_keys & MODEL_KEYS)
        self.label = label
        self.limit = limit
        self.variables: list[m.Variable] = []
        self.tensors: dict[str, TensorRef] = {}
        self.values: dict[str, np.ndarray] = {}
        self.strings: dict[str, str] = {}
        self.used: set[str] = set()
        self.entries = 0

    def unique(self, name: str) -> str:
        """``name``, or ``name#2``, ``name#3``... when an earlier entry took it."""
        if name not in self.used:
            self.used.add(name)
            return name
        i = 2
        while f"{name}#{i}" in self.used:
            i += 1
        self.used.add(f"{name}#{i}")
        return f"{name}#{i}"

    def role_of(self, parts: tuple[str, ...], optimizer: bool, is_tensor: bool) -> str:
        """Optimizer state under an optimizer key; numbers and counters are metadata; tensors
        outside the model's key (when the file has one) too."""
        if optimizer or any(p.lower() in OPTIMIZER_KEYS for p in parts):
            return m.ROLE_OPTIMIZER
        if not is_tensor:
            return m.ROLE_METADATA
        if parts and parts[0].lower() in COUNTER_KEYS and len(parts) == 1:
            return m.ROLE_METADATA
        if self.has_model_key and not (parts and parts[0].lower() in MODEL_KEYS):
            return m.ROLE_METADATA
        return m.ROLE_MODEL

    def count(self, parts: tuple[str, ...]) -> None:
        """One more entry reached: refuse a pickle bomb or a nesting too deep."""
        self.entries += 1
        if self.entries > self.limit:
            raise UnsafeFileError(
                f"{self.label}: the pickle expands to more than {self.limit} entries (shared containers);"
                " refusing a possible pickle bomb"
            )
        if len(parts) > MAX_DEPTH:
            raise UnsafeFileError(f"{self.label}: the pickle nests more than {MAX_DEPTH} levels deep; refusing")

    def add_tensor(self, name: str, ref: TensorRef, parts: tuple[str, ...], optimizer: bool) -> None:
        key = self.unique(name)
        self.tensors[key] = ref
        nbytes = ref.numel * TORCH_ITEMSIZE[ref.dtype]
        self.variables.append(m.Variable(key=key, name=key, shape=ref.shape, dtype=ref.dtype, nbytes=nbytes,
                                         role=self.role_of(parts, optimizer, True)))

    def add_value(self, name: str, arr: np.ndarray, parts: tuple[str, ...], optimizer: bool) -> None:
        """A number, a list of numbers or a numpy value read from the pickle itself."""
        key = self.unique(name)
        self.values[key] = arr
        self.variables.append(m.Variable(key=key, name=key, shape=arr.shape, dtype=_dtype_name(arr),
                                         nbytes=arr.nbytes, role=self.role_of(parts, optimizer, False)))

    def run(self, obj: Any) -> None:
        """Depth-first, in pickle order, with an explicit stack (no recursion)."""
        stack: list[tuple[Any, tuple[str, ...], bool]] = [(obj, (), False)]
        while stack:
            value, parts, optimizer = stack.pop()
            self.count(parts)
            name = "/".join(parts) if parts else TOP_TENSOR_NAME
            if isinstance(value, TensorRef):
                self.add_tensor(name, value, parts, optimizer)
            elif isinstance(value, StorageRef):  # a storage saved by itself: its elements, 1-d
                ref = TensorRef(storage=value, dtype=value.dtype, offset=0, shape=(value.numel,), stride=(1,))
                stack.append((ref, parts, optimizer))
                self.entries -= 1
            elif isinstance(value, dict):
                child_optimizer = optimizer or (OPTIMIZER_STRUCTURE <= {str(k) for k in value} and len(value) <= 3)
                for k, v in reversed(list(value.items())):
                    stack.append((v, (*parts, _key_text(k)), child_optimizer))
            elif isinstance(value, (list, tuple)):
                if value and all(_is_number(x) for x in value):
                    arr = _number_array(value)
                    if arr is not None:
                        self.add_value(name, arr, parts, optimizer)
                    continue
                for i in range(len(value) - 1, -1, -1):
                    stack.append((value[i], (*parts, str(i)), optimizer))
            elif isinstance(value, StandIn):
                arr = numpy_value(value)
                if arr is not None:
                    if parts:
                        self.add_value(name, arr, parts, optimizer)
                    continue
                for k, v in reversed(_stand_in_children(value)):
                    stack.append((v, (*parts, k), optimizer))
            elif isinstance(value, (bool, int, float)):
                arr = _number_array(value)
                if arr is not None and parts:
                    self.add_value(name, arr, parts, optimizer)
            elif isinstance(value, str) and parts and len(self.strings) < MAX_INFO_STRINGS:
                self.strings[name] = value if len(value) <= MAX_INFO_STRING_CHARS else value[:MAX_INFO_STRING_CHARS] + "..."


def _step_of(obj: Any) -> tuple[int | None, str | None]:
    """The step a training dict records (:data:`STEP_KEYS`, first found), and where from."""
    if isinstance(obj, dict):
        for k in STEP_KEYS:
            v = obj.get(k)
            if isinstance(v, StandIn):  # a numpy integer scalar
                arr = numpy_value(v)
                v = int(arr) if arr is not None and arr.ndim == 0 and arr.dtype.kind in "iu" else None
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                return v, f"variable:{k}"
    return None, None


def _ties(tensors: dict[str, TensorRef]) -> list[list[str]]:
    """Names of one view of one storage (tied weights), each group in walk order."""
    groups: dict[tuple, list[str]] = {}
    for key, ref in tensors.items():
        groups.setdefault((ref.storage.key, ref.byte_start, ref.shape, ref.stride, ref.dtype), []).append(key)
    return [keys for keys in groups.values() if len(keys) > 1]


def flatten(obj: Any, label: str, opcodes: int | None = None) -> Flat:
    """Name every tensor and number of an unpickled object.

    Args:
        obj: The unpickled object.
        label: How messages name the file.
        opcodes: The pickle's opcode count, which bounds how many entries it may expand to.

    Raises:
        UnsafeFileError: Nesting deeper than :data:`MAX_DEPTH`, or more than
            :data:`MAX_ENTRIES` entries (shared containers counted each time they are reached).
    """
    limit = MAX_ENTRIES if opcodes is None else min(MAX_ENTRIES, ENTRIES_PER_OPCODE * opcodes + MIN_ENTRIES)
    walk = _Walk(obj, label, limit)
    walk.run(obj)
    step, step_source = _step_of(obj)
    roots = {v.key.split("/", 1)[0] for v in walk.variables if v.role == m.ROLE_MODEL}
    prefix = f"{roots.pop()}/" if walk.has_model_key and len(roots) == 1 else None
    return Flat(walk.variables, walk.tensors, walk.values, walk.strings, step, step_source, _ties(walk.tensors), prefix)
