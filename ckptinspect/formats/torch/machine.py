"""The pickle machine: a pickle's opcodes run in Python, every object it builds bounded.

CPython's own unpickler (``_pickle``) builds containers in C: a 300,000-deep tuple used as a
dict key is hashed recursively there and kills the process (SIGSEGV), ``BUILD`` writes into any
object's ``__dict__`` (even a frozen dataclass's), and nothing bounds what calls materialise.
:class:`Machine` runs the opcodes torch and pickle write (protocols 0-5, without the ones
:func:`~.unpickle.scan` refuses) with three general bounds, whatever the objects are:

* **nesting**: every container it builds (tuples, lists, dicts, sets, the results of calls) has
  a depth, checked against :data:`MAX_DEPTH` when it is built or grows, before Python hashes
  or compares it;
* **bytes**: every string, bytes object and container slot it creates, and every result of a
  call (estimated from the call's arguments *before* the call), is charged to a budget
  (:attr:`Machine.budget`): a memoised 1 MiB argument passed to a thousand calls is refused,
  not copied a thousand times;
* **numbers**: ints longer than :data:`MAX_INT_BITS` bits (more digits than Python prints) are
  damage.

What globals resolve to, what calls, ``NEWOBJ`` and ``BUILD`` may do, and persistent ids are
the subclass's business (:class:`~.unpickle.TorchMachine`): the machine itself never imports or
calls anything the pickle names.
"""

from __future__ import annotations

import codecs
import struct
from typing import Any

from ...errors import CorruptCheckpointError, UnsafeFileError

__all__ = ["Machine", "MAX_DEPTH", "MAX_INT_BITS", "Damaged", "Refused", "RanOut", "REFUSED_OPCODES"]

MAX_DEPTH = 200  # containers nested deeper than this are refused
MAX_INT_BITS = 14_000  # about 4,200 decimal digits: Python refuses to print longer ints
SLOT_BYTES = 8  # what one container slot is charged
CONTAINER_BYTES = 32  # what one container is charged (besides its slots)
OBJECT_BYTES = 64  # what one object made by a call is charged (besides what the call copies)

_FLOAT = struct.Struct(">d")
_I4 = struct.Struct("<i")


class Damaged(Exception):
    """Raised inside the machine: the pickle is damaged (a CorruptCheckpointError outside)."""


class Refused(Exception):
    """Raised inside the machine: the pickle is refused (an UnsafeFileError outside)."""


class _Mark:
    """The MARK opcode's place on the stack."""


class RanOut(Exception):
    """Raised inside the machine: the bytes end before the pickle does.

    Attributes:
        needed: Bytes from the pickle's start that the opcode needs, when it declares them.
    """

    def __init__(self, message: str, needed: int | None = None):
        super().__init__(message)
        self.needed = needed


# Opcodes a torch pickle never holds, refused by name: other ways to instantiate (INST/OBJ call a
# class with arguments, EXT* go through the copyreg registry, NEWOBJ_EX passes keyword
# arguments), text persistent ids, protocol-5 buffers.
REFUSED_OPCODES = {
    0x69: "INST", 0x6F: "OBJ", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x92: "NEWOBJ_EX", 0x50: "PERSID",
    0x96: "BYTEARRAY8", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}


class Machine:
    """Runs one pickle's opcodes. Subclasses decide what globals, calls and BUILD do.

    Args:
        data: The bytes; the pickle starts at ``start`` and ends at its STOP opcode.
        start: Where it starts.
        budget: Bytes the objects built may add up to.
        max_bytes: A pickle longer than this is refused.
        max_opcodes: A pickle of more opcodes is refused.

    After :meth:`run`: :attr:`end` (just past STOP), :attr:`opcodes`, :attr:`globals` (every
    ``module.name`` resolved, in order).
    """

    def __init__(self, data: bytes, start: int, budget: int, max_bytes: int, max_opcodes: int):
        self.data = data
        self.start = start
        self.pos = start
        self.limit = min(len(data), start + max_bytes)
        self.max_bytes = max_bytes
        self.max_opcodes = max_opcodes
        self.budget = budget
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.depths: dict[int, int] = {}  # id(container) -> its nesting depth
        self.alive: list[Any] = []  # every container with a depth, so its id is never reused
        self.globals: dict[str, None] = {}
        self.proto = 0
        self.opcodes = 0
        self.end = start

    # -- hooks (the subclass's policy) ---------------------------------------------------
    def find_class(self, module: str, name: str) -> Any:  # pragma: no cover - overridden
        raise Refused(f"global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:  # pragma: no cover - overridden
        raise Damaged("a persistent id")

    def call(self, func: Any, args: tuple) -> Any:  # pragma: no cover - overridden
        raise Damaged(f"REDUCE of {type(func).__name__}")

    def new(self, cls: Any, args: tuple) -> Any:  # pragma: no cover - overridden
        raise Damaged(f"NEWOBJ of {type(cls).__name__}")

    def build(self, inst: Any, state: Any) -> None:  # pragma: no cover - overridden
        raise Refused(f"BUILD of {type(inst).__name__}")

    def set_items(self, target: Any, pairs: list[tuple[Any, Any]]) -> None:
        """SETITEM(S) on what is not a dict."""
        raise Damaged(f"SETITEM on {type(target).__name__}")

    def append_items(self, target: Any, items: list[Any]) -> None:
        """APPEND(S) on what is not a list."""
        raise Damaged(f"APPEND on {type(target).__name__}")

    def add_items(self, target: Any, items: list[Any]) -> None:
        """ADDITEMS on what is not a set."""
        raise Damaged(f"ADDITEMS on {type(target).__name__}")

    # -- bounds --------------------------------------------------------------------------
    def charge(self, nbytes: int) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise Refused("the objects it builds need more memory than its size allows; refusing a possible memory bomb")

    def depth(self, obj: Any) -> int:
        return self.depths.get(id(obj), 0)

    def set_depth(self, obj: Any, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise Refused(f"the pickle nests more than {MAX_DEPTH} levels deep; refusing")
        key = id(obj)
        if key not in self.depths:
            self.alive.append(obj)
        self.depths[key] = depth

    def container(self, obj: Any, items: Any) -> Any:
        """``obj`` (new, holding ``items``): its depth checked and its slots charged (an empty
        one has depth 0 until it grows: nothing to record)."""
        self.charge(SLOT_BYTES * len(items) + CONTAINER_BYTES)
        if not items:
            return obj
        deepest = 0
        depths = self.depths
        for item in items:
            d = depths.get(id(item), 0)
            if d > deepest:
                deepest = d
        self.set_depth(obj, deepest + 1)
        return obj

    def grow(self, obj: Any, items: Any) -> None:
        """``items`` go into the existing container ``obj``: its depth and slots."""
        deepest = max(0, self.depth(obj) - 1)
        depths = self.depths
        for item in items:
            d = depths.get(id(item), 0)
            if d > deepest:
                deepest = d
        self.charge(SLOT_BYTES * len(items))
        self.set_depth(obj, deepest + 1)

    # -- reading arguments ---------------------------------------------------------------
    def ran_out(self, at: int, needed_end: int | None) -> Exception:
        """What to raise when an opcode at ``at`` needs bytes up to ``needed_end`` (None: a
        line or the STOP opcode) past the bytes there are."""
        if self.limit < len(self.data) and (needed_end is None or needed_end > self.limit):
            return Refused(f"the pickle is larger than {self.max_bytes} bytes; refusing")
        if needed_end is None:
            return RanOut(f"not a complete pickle: it ends without a STOP opcode after byte {at}")
        return RanOut(f"not a complete pickle: the opcode at byte {at} needs bytes up to {needed_end},"
                      f" {len(self.data)} are there", needed=needed_end - self.start)

    def read(self, n: int) -> bytes:
        pos = self.pos
        if n < 0:
            raise Damaged(f"an opcode before byte {pos} declares {n} bytes")
        if pos + n > self.limit:
            raise self.ran_out(pos - 1, pos + n)
        self.pos = pos + n
        return self.data[pos : pos + n]

    def readline(self) -> bytes:
        end = self.data.find(b"\n", self.pos, self.limit)
        if end < 0:
            raise self.ran_out(self.pos - 1, None)
        line = self.data[self.pos : end]
        self.pos = end + 1
        return line

    def pop_mark(self) -> list[Any]:
        if not self.metastack:
            raise Damaged("an opcode needs a MARK the pickle never set")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def pop(self) -> Any:
        if not self.stack:
            raise Damaged("an opcode needs a value on an empty stack")
        return self.stack.pop()

    def top(self) -> Any:
        if not self.stack:
            raise Damaged("an opcode needs a value on an empty stack")
        return self.stack[-1]

    def text(self, raw: bytes) -> str:
        self.charge(len(raw))
        try:
            return raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            raise Damaged(f"text that is not UTF-8 ({e.reason})") from None

    def blob(self, raw: bytes) -> bytes:
        self.charge(len(raw))
        return raw

    def long(self, raw: bytes) -> int:
        if len(raw) * 8 > MAX_INT_BITS:
            raise Damaged(f"an int of {len(raw)} bytes (more than {MAX_INT_BITS} bits)")
        return int.from_bytes(raw, "little", signed=True)

    def text_int(self, line: bytes) -> int:
        line = line.rstrip(b"L")
        if len(line) > MAX_INT_BITS * 3 // 10:
            raise Damaged(f"an int of {len(line)} digits")
        try:
            return int(line)
        except ValueError:
            raise Damaged(f"int {line[:20]!r} is not a number") from None

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> Any:
        """Run to STOP; the object. The opcodes torch writes most are run inline here (the
        stack, memo and position in locals); the others through their ``op_*`` methods."""
        data = self.data
        limit = self.limit
        pos = self.pos
        stack = self.stack
        metastack = self.metastack
        memo = self.memo
        depths = self.depths
        max_opcodes = self.max_opcodes
        dispatch = _DISPATCH
        alive = self.alive
        known_globals: dict[bytes, Any] = {}
        count = self.opcodes
        try:
            while True:
                if pos >= limit:
                    self.pos = pos
                    raise self.ran_out(pos, None)
                op = data[pos]
                pos += 1
                count += 1
                if count > max_opcodes:
                    raise Refused(f"the pickle has more than {max_opcodes} opcodes; refusing")
                if op == 0x71 or op == 0x72:  # BINPUT, LONG_BINPUT
                    n = 1 if op == 0x71 else 4
                    if pos + n > limit:
                        raise self.ran_out(pos - 1, pos + n)
                    index = data[pos] if n == 1 else int.from_bytes(data[pos : pos + 4], "little")
                    if index > len(memo):
                        raise Refused(f"pickle memo index {index} at byte {pos - 1} is out of sequence ({len(memo)}"
                                      " entries so far); refusing a possible memory bomb")
                    pos += n
                    memo[index] = stack[-1]
                elif op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
                    n = 1 if op == 0x68 else 4
                    if pos + n > limit:
                        raise self.ran_out(pos - 1, pos + n)
                    index = data[pos] if n == 1 else int.from_bytes(data[pos : pos + 4], "little")
                    pos += n
                    try:
                        stack.append(memo[index])
                    except KeyError:
                        raise Damaged(f"memo entry {index} is read before it is written") from None
                elif op == 0x58 or op == 0x8C:  # BINUNICODE, SHORT_BINUNICODE
                    if op == 0x58:
                        if pos + 4 > limit:
                            raise self.ran_out(pos - 1, pos + 4)
                        n = int.from_bytes(data[pos : pos + 4], "little")
                        pos += 4
                    else:
                        if pos + 1 > limit:
                            raise self.ran_out(pos - 1, pos + 1)
                        n = data[pos]
                        pos += 1
                    if pos + n > limit:
                        raise self.ran_out(pos - 5, pos + n)
                    self.budget -= n
                    if self.budget < 0:
                        self.charge(0)
                    try:
                        stack.append(data[pos : pos + n].decode("utf-8", "surrogatepass"))
                    except UnicodeDecodeError as e:
                        raise Damaged(f"text that is not UTF-8 at byte {pos} ({e.reason})") from None
                    pos += n
                elif op == 0x28:  # MARK
                    metastack.append(stack)
                    stack = []
                elif op == 0x74 or op == 0x85 or op == 0x86 or op == 0x87 or op == 0x6C:  # TUPLE, TUPLE1-3, LIST
                    if op == 0x74 or op == 0x6C:
                        if not metastack:
                            raise Damaged(f"an opcode at byte {pos - 1} needs a MARK the pickle never set")
                        items = stack
                        stack = metastack.pop()
                    else:
                        n = op - 0x84
                        if len(stack) < n:
                            raise Damaged(f"an opcode at byte {pos - 1} needs a value on an empty stack")
                        items = stack[-n:]
                        del stack[-n:]
                    made = tuple(items) if op != 0x6C else items
                    self.budget -= SLOT_BYTES * len(items) + CONTAINER_BYTES
                    if self.budget < 0:
                        self.charge(0)
                    if items:
                        deepest = 0
                        for item in items:
                            d = depths.get(id(item), 0)
                            if d > deepest:
                                deepest = d
                        if deepest >= MAX_DEPTH:
                            self.set_depth(made, deepest + 1)
                        depths[id(made)] = deepest + 1
                        alive.append(made)
                    stack.append(made)
                elif op == 0x4B:  # BININT1
                    if pos >= limit:
                        raise self.ran_out(pos - 1, pos + 1)
                    stack.append(data[pos])
                    pos += 1
                elif op == 0x4A:  # BININT
                    if pos + 4 > limit:
                        raise self.ran_out(pos - 1, pos + 4)
                    stack.append(int.from_bytes(data[pos : pos + 4], "little", signed=True))
                    pos += 4
                elif op == 0x89:  # NEWFALSE
                    stack.append(False)
                elif op == 0x88:  # NEWTRUE
                    stack.append(True)
                elif op == 0x4E:  # NONE
                    stack.append(None)
                elif op == 0x7D or op == 0x5D or op == 0x29:  # EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
                    self.budget -= CONTAINER_BYTES
                    if self.budget < 0:
                        self.charge(0)
                    stack.append({} if op == 0x7D else [] if op == 0x5D else ())
                elif op == 0x52:  # REDUCE
                    args = stack.pop()
                    if type(args) is not tuple:
                        raise Damaged(f"REDUCE with {type(args).__name__} arguments at byte {pos - 1}")
                    stack[-1] = self.call(stack[-1], args)
                elif op == 0x51:  # BINPERSID
                    stack[-1] = self.persistent_load(stack[-1])
                elif op == 0x63:  # GLOBAL (resolved once per distinct name)
                    nl1 = data.find(b"\n", pos, limit)
                    nl2 = data.find(b"\n", nl1 + 1, limit) if nl1 >= 0 else -1
                    if nl2 < 0:
                        raise self.ran_out(pos - 1, None)
                    raw = data[pos:nl2]
                    found = known_globals.get(raw, known_globals)
                    if found is known_globals:
                        found = known_globals[raw] = self.find_class(
                            data[pos:nl1].decode("utf-8", "replace"), data[nl1 + 1 : nl2].decode("utf-8", "replace"))
                    pos = nl2 + 1
                    stack.append(found)
                elif op == 0x94:  # MEMOIZE
                    memo[len(memo)] = stack[-1]
                elif op == 0x2E:  # STOP
                    self.pos = self.end = pos
                    self.opcodes = count
                    self.stack = stack
                    return stack.pop()
                elif op in REFUSED_OPCODES:
                    raise Refused(f"pickle opcode {REFUSED_OPCODES[op]} at byte {pos - 1}, which torch.save never"
                                  " writes; refusing")
                else:
                    handler = dispatch.get(op)
                    if handler is None:
                        raise Damaged(f"unknown opcode {op:#04x} at byte {pos - 1}")
                    self.pos = pos
                    self.stack = stack
                    handler(self)
                    pos = self.pos
                    stack = self.stack
        except IndexError:  # a pop from an empty stack (every read of the bytes is checked)
            raise Damaged(f"an opcode at byte {pos - 1} needs a value on an empty stack") from None
        finally:
            self.opcodes = count

    # protocol and framing
    def op_proto(self) -> None:
        self.proto = self.read(1)[0]

    def op_frame(self) -> None:
        self.read(8)

    # the stack
    def op_mark(self) -> None:
        self.metastack.append(self.stack)
        self.stack = []

    def op_pop(self) -> None:
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def op_pop_mark(self) -> None:
        self.pop_mark()

    def op_dup(self) -> None:
        self.stack.append(self.top())

    # constants and numbers
    def op_none(self) -> None:
        self.stack.append(None)

    def op_true(self) -> None:
        self.stack.append(True)

    def op_false(self) -> None:
        self.stack.append(False)

    def op_int(self) -> None:
        line = self.readline()
        if line == b"00":
            self.stack.append(False)
        elif line == b"01":
            self.stack.append(True)
        else:
            self.stack.append(self.text_int(line))

    def op_binint(self) -> None:
        self.stack.append(_I4.unpack(self.read(4))[0])

    def op_binint1(self) -> None:
        self.stack.append(self.read(1)[0])

    def op_binint2(self) -> None:
        self.stack.append(int.from_bytes(self.read(2), "little"))

    def op_long(self) -> None:
        self.stack.append(self.text_int(self.readline()))

    def op_long1(self) -> None:
        self.stack.append(self.long(self.read(self.read(1)[0])))

    def op_long4(self) -> None:
        n = _I4.unpack(self.read(4))[0]
        if n * 8 > MAX_INT_BITS:
            raise Damaged(f"an int of {n} bytes (more than {MAX_INT_BITS} bits)")
        self.stack.append(self.long(self.read(n)))

    def op_float(self) -> None:
        line = self.readline()
        try:
            self.stack.append(float(line))
        except ValueError:
            raise Damaged(f"float {line[:20]!r} is not a number") from None

    def op_binfloat(self) -> None:
        self.stack.append(_FLOAT.unpack(self.read(8))[0])

    # strings and bytes
    def op_string(self) -> None:  # protocol 0 py2 str: a quoted repr
        line = self.readline()
        if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b"'", b'"'):
            raise Damaged("the STRING opcode's argument is not quoted")
        try:
            raw = codecs.escape_decode(line[1:-1])[0]
        except ValueError as e:
            raise Damaged(f"STRING: {e}") from None
        self.stack.append(self.text(raw))

    def op_binstring(self) -> None:
        n = _I4.unpack(self.read(4))[0]
        self.stack.append(self.text(self.read(n)))

    def op_short_binstring(self) -> None:
        self.stack.append(self.text(self.read(self.read(1)[0])))

    def op_binbytes(self) -> None:
        self.stack.append(self.blob(self.read(int.from_bytes(self.read(4), "little"))))

    def op_short_binbytes(self) -> None:
        self.stack.append(self.blob(self.read(self.read(1)[0])))

    def op_binbytes8(self) -> None:
        self.stack.append(self.blob(self.read(int.from_bytes(self.read(8), "little"))))

    def op_unicode(self) -> None:
        raw = self.readline()
        self.charge(len(raw))
        try:
            self.stack.append(str(raw, "raw-unicode-escape"))
        except UnicodeDecodeError as e:
            raise Damaged(f"UNICODE: {e.reason}") from None

    def op_binunicode(self) -> None:
        self.stack.append(self.text(self.read(int.from_bytes(self.read(4), "little"))))

    def op_short_binunicode(self) -> None:
        self.stack.append(self.text(self.read(self.read(1)[0])))

    def op_binunicode8(self) -> None:
        self.stack.append(self.text(self.read(int.from_bytes(self.read(8), "little"))))

    # containers
    def op_empty_tuple(self) -> None:
        self.stack.append(())

    def _tuple(self, items: list[Any]) -> None:
        t = tuple(items)
        self.stack.append(self.container(t, t) if t else t)

    def op_tuple(self) -> None:
        self._tuple(self.pop_mark())

    def op_tuple1(self) -> None:
        self._tuple([self.pop()])

    def op_tuple2(self) -> None:
        b, a = self.pop(), self.pop()
        self._tuple([a, b])

    def op_tuple3(self) -> None:
        c, b, a = self.pop(), self.pop(), self.pop()
        self._tuple([a, b, c])

    def op_empty_list(self) -> None:
        self.stack.append(self.container([], ()))

    def op_list(self) -> None:
        items = self.pop_mark()
        self.stack.append(self.container(items, items))

    def op_append(self) -> None:
        value = self.pop()
        self._append(self.top(), [value])

    def op_appends(self) -> None:
        items = self.pop_mark()
        self._append(self.top(), items)

    def _append(self, target: Any, items: list[Any]) -> None:
        if type(target) is list:
            self.grow(target, items)
            target.extend(items)
        else:
            self.append_items(target, items)

    def op_empty_dict(self) -> None:
        self.stack.append(self.container({}, ()))

    def op_dict(self) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise Damaged("DICT with an odd number of items")
        d: dict[Any, Any] = {}
        self.container(d, items)
        self._set_pairs(d, list(zip(items[::2], items[1::2])))
        self.stack.append(d)

    def op_setitem(self) -> None:
        value, key = self.pop(), self.pop()
        self._setitems(self.top(), [(key, value)])

    def op_setitems(self) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise Damaged("SETITEMS with an odd number of items")
        self._setitems(self.top(), list(zip(items[::2], items[1::2])))

    def _setitems(self, target: Any, pairs: list[tuple[Any, Any]]) -> None:
        if isinstance(target, dict):  # a dict the machine built (plain, or a subclass's stand-in)
            self.grow(target, [x for pair in pairs for x in pair])
            self._set_pairs(target, pairs)
        else:
            self.set_items(target, pairs)

    def _set_pairs(self, d: dict, pairs: list[tuple[Any, Any]]) -> None:
        try:
            for k, v in pairs:
                d[k] = v  # keys are hashed here: their depth is bounded
        except TypeError as e:
            raise Damaged(f"a dict key that cannot be one: {e}") from None

    def op_empty_set(self) -> None:
        self.stack.append(self.container(set(), ()))

    def op_additems(self) -> None:
        items = self.pop_mark()
        target = self.top()
        if type(target) is set:
            self.grow(target, items)
            try:
                target.update(items)
            except TypeError as e:
                raise Damaged(f"a set item that cannot be one: {e}") from None
        else:
            self.add_items(target, items)

    def op_frozenset(self) -> None:
        items = self.pop_mark()
        try:
            fs = frozenset(items)
        except TypeError as e:
            raise Damaged(f"a set item that cannot be one: {e}") from None
        self.stack.append(self.container(fs, items))

    # the memo
    def _get(self, index: int) -> None:
        try:
            self.stack.append(self.memo[index])
        except KeyError:
            raise Damaged(f"memo entry {index} is read before it is written") from None

    def op_get(self) -> None:
        self._get(self.text_int(self.readline()))


    # globals, calls, persistent ids
    def op_global(self) -> None:
        module = self.readline().decode("utf-8", "replace")
        name = self.readline().decode("utf-8", "replace")
        self.stack.append(self.find_class(module, name))

    def op_stack_global(self) -> None:
        name, module = self.pop(), self.pop()
        if type(module) is not str or type(name) is not str:
            raise Damaged("STACK_GLOBAL of values that are not strings")
        self.stack.append(self.find_class(module, name))

    def op_put(self) -> None:
        line = self.readline()
        index = int(line) if line.isdigit() and len(line) < 12 else -1
        if not 0 <= index <= len(self.memo):
            raise Refused(f"pickle memo index {line[:20]!r} is out of sequence ({len(self.memo)} entries so far);"
                          " refusing a possible memory bomb")
        self.memo[index] = self.top()

    def op_reduce(self) -> None:
        args = self.pop()
        func = self.pop()
        if type(args) is not tuple:
            raise Damaged(f"REDUCE with {type(args).__name__} arguments")
        self.stack.append(self.call(func, args))

    def op_newobj(self) -> None:
        args = self.pop()
        cls = self.pop()
        if type(args) is not tuple:
            raise Damaged(f"NEWOBJ with {type(args).__name__} arguments")
        self.stack.append(self.new(cls, args))

    def op_build(self) -> None:
        state = self.pop()
        self.build(self.top(), state)

    def op_binpersid(self) -> None:
        self.stack.append(self.persistent_load(self.pop()))


_NAMES = {
    "PROTO": Machine.op_proto, "FRAME": Machine.op_frame, "MARK": Machine.op_mark, "POP": Machine.op_pop,
    "POP_MARK": Machine.op_pop_mark, "DUP": Machine.op_dup, "NONE": Machine.op_none, "NEWTRUE": Machine.op_true,
    "NEWFALSE": Machine.op_false, "INT": Machine.op_int, "BININT": Machine.op_binint, "BININT1": Machine.op_binint1,
    "BININT2": Machine.op_binint2, "LONG": Machine.op_long, "LONG1": Machine.op_long1, "LONG4": Machine.op_long4,
    "FLOAT": Machine.op_float, "BINFLOAT": Machine.op_binfloat, "STRING": Machine.op_string,
    "BINSTRING": Machine.op_binstring, "SHORT_BINSTRING": Machine.op_short_binstring,
    "BINBYTES": Machine.op_binbytes, "SHORT_BINBYTES": Machine.op_short_binbytes,
    "BINBYTES8": Machine.op_binbytes8, "UNICODE": Machine.op_unicode, "BINUNICODE": Machine.op_binunicode,
    "SHORT_BINUNICODE": Machine.op_short_binunicode, "BINUNICODE8": Machine.op_binunicode8,
    "EMPTY_TUPLE": Machine.op_empty_tuple, "TUPLE": Machine.op_tuple, "TUPLE1": Machine.op_tuple1,
    "TUPLE2": Machine.op_tuple2, "TUPLE3": Machine.op_tuple3, "EMPTY_LIST": Machine.op_empty_list,
    "LIST": Machine.op_list, "APPEND": Machine.op_append, "APPENDS": Machine.op_appends,
    "EMPTY_DICT": Machine.op_empty_dict, "DICT": Machine.op_dict, "SETITEM": Machine.op_setitem,
    "SETITEMS": Machine.op_setitems, "EMPTY_SET": Machine.op_empty_set, "ADDITEMS": Machine.op_additems,
    "FROZENSET": Machine.op_frozenset, "GET": Machine.op_get,
    "PUT": Machine.op_put, "GLOBAL": Machine.op_global,
    "STACK_GLOBAL": Machine.op_stack_global, "REDUCE": Machine.op_reduce, "NEWOBJ": Machine.op_newobj,
    "BUILD": Machine.op_build, "BINPERSID": Machine.op_binpersid,
}


def _dispatch() -> dict[int, Any]:
    import pickletools  # noqa: PLC0415

    codes = {info.name: ord(info.code.encode("latin-1")) for info in pickletools.opcodes}
    return {codes[name]: fn for name, fn in _NAMES.items()}


_DISPATCH = _dispatch()
