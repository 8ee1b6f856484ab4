"""The format registry: one ordered list of format specs, from which detection, the kinds, the
format names, the "expected one of" message and the help texts are all derived.

A spec says how a path is recognised (a content sniff that imports no reader), where it is
looked for (a prefix that need not exist, a directory, a file), how it is opened and checked
(``"module:function"`` under :mod:`ckptinspect.formats`, imported on first use), the format
names its checkpoints carry, and what it can do (:data:`CAPABILITIES`). The order of
:data:`SPECS` is the order of detection. Near misses (a TF data shard, a SavedModel's graph, a
``.meta`` file...) are refusals: functions that raise a :class:`NotACheckpointError` saying what
to pass instead, registered by their family for the phase where they apply.

Adding a format is one module (or package) with a sniff, an opener and, where the format can
do better than reading every value, a checker, plus one :func:`register` call (see
docs/ARCHITECTURE.md, "Adding a format").
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from . import _fs

__all__ = [
    "AT_PREFIX",
    "AT_DIRECTORY",
    "AT_FILE",
    "CAPABILITIES",
    "FormatSpec",
    "Probe",
    "SPECS",
    "REFUSALS",
    "register",
    "refusal",
    "spec_for",
    "capabilities",
    "resolve",
]

AT_PREFIX = "prefix"  # a path that need not exist itself (a TF bundle's prefix)
AT_DIRECTORY = "directory"
AT_FILE = "file"
PLACES = (AT_PREFIX, AT_DIRECTORY, AT_FILE)

# Refusal phases: for a path that does not exist; for a regular file before any file sniff; for
# a regular file no sniff recognised.
MISSING = "missing"
BEFORE_FILES = "before-files"
AFTER_FILES = "after-files"

# What a format can do, asked by the operations instead of its name.
CAPABILITIES = {
    "object-graph": "holds a TF2 object graph (names and roles from it; kept by extract and rewrite)",
    "slices": "keeps partitioned variables as stored slices",
    "stored-bytes": "values stored raw, so a copy can take them byte for byte",
    "checksums": "stores a checksum per tensor, checked on every read",
    "tf-restorable": "restores into a TF model (tf.train.Checkpoint.read, init_from_checkpoint)",
    "series": "a directory holding a series of checkpoints (ls DIR shows the newest, verify DIR checks each, scan and average --last go through them)",
    "writable": "the format can be written (extract, rewrite, average outputs)",
    "keras-layout": "variables named and ordered as Keras saves them (layers, each layer class's variables)",
}

# The head a probe reads once: enough for the HDF5 superblock at its last user-block offset.
PROBE_HEAD_BYTES = 2056


class Probe:
    """One path under detection, with what the sniffs ask of it read once each.

    ``memo`` keeps what a family computed for one sniff and needs again in another (a table's
    kind, say), so that no file is parsed twice.
    """

    __slots__ = ("path", "name", "memo", "_head", "_exists", "_isdir")

    def __init__(self, path: str):
        self.path = path
        self.name = _fs.basename(path)
        self.memo: dict[str, Any] = {}
        self._head: bytes | None = None
        self._exists: bool | None = None
        self._isdir: bool | None = None

    @property
    def exists(self) -> bool:
        if self._exists is None:
            self._exists = _fs.exists(self.path)
        return self._exists

    @property
    def isdir(self) -> bool:
        if self._isdir is None:
            self._isdir = _fs.isdir(self.path)
        return self._isdir

    def head(self, size: int) -> bytes:
        """The file's first ``size`` bytes (b'' for special or unreadable files), read once."""
        if size > PROBE_HEAD_BYTES:
            return _fs.read_head(self.path, size)
        if self._head is None:
            self._head = _fs.read_head(self.path, PROBE_HEAD_BYTES)
        return self._head[:size]


def resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    """The function named ``"module:function"`` (module relative to ``ckptinspect.formats``),
    imported now; a callable (a format registered from outside the package) as it is."""
    if callable(target):
        return target
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(f".{module}", __package__), name)


class FormatSpec:
    """One kind of path the tool opens (a plain class: a dataclass costs start-up).

    Attributes:
        kind: The kind's name (``"tf-bundle"``): :class:`Kind` values, ``verify``'s format for a
            path that cannot be opened.
        member: The :class:`Kind` member's name (``"TF_BUNDLE"``).
        family: The family package it belongs to (``"tf"``, ``"keras"``...).
        at: Where it is looked for: :data:`AT_PREFIX`, :data:`AT_DIRECTORY` or :data:`AT_FILE`.
        sniff: ``sniff(probe) -> str | None``: the path to open (a prefix, the file, the
            directory), or None when the path is not of this kind. Imports no reader.
        open: ``"module:function"`` (or a function) opening the target into a Checkpoint; None
            for a kind that is never opened itself (``redirect``).
        check: ``"module:function"`` (or a function) planning ``verify``'s check; None: checked
            by opening and reading every value in blocks.
        formats: The ``Checkpoint.format`` names its checkpoints carry.
        describe: A few words for the "expected one of" message and the help.
        capabilities: Names from :data:`CAPABILITIES`.
        redirect: The sniff returns another path to detect (a Hugging Face folder's weights file).
        member: The :class:`Kind` member's name when it is not ``kind`` in capitals.
        label: The format ``verify`` reports for a file of this kind it cannot open (default:
            ``kind``).

    A kind found at two places (a TF bundle: its prefix, or its ``.index`` file) has one spec per
    place; the first one registered carries the opener and the checker.
    """

    __slots__ = ("kind", "member", "family", "at", "sniff", "open", "check", "formats", "describe",
                 "capabilities", "redirect", "label")

    def __init__(self, kind: str, family: str, at: str, sniff: Callable[[Probe], str | None], *,
                 open: str | Callable[[str], Any] | None, check: str | Callable[[str], Any] | None = None, formats: tuple[str, ...] = (),  # noqa: A002
                 describe: str = "", capabilities: tuple[str, ...] = (), redirect: bool = False,
                 member: str | None = None, label: str | None = None):
        if at not in PLACES:
            raise ValueError(f"at must be one of {PLACES}. Received: {at!r}")
        unknown = set(capabilities) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {sorted(CAPABILITIES)}")
        self.kind = kind
        self.member = member or kind.upper().replace("-", "_")
        self.family = family
        self.at = at
        self.sniff = sniff
        self.open = open
        self.check = check
        self.formats = formats
        self.describe = describe
        self.capabilities = frozenset(capabilities)
        self.redirect = redirect
        self.label = label or kind

    @property
    def name(self) -> str:
        """The :class:`Kind` member's name (as an enum member's)."""
        return self.member

    @property
    def value(self) -> str:
        """The kind's name (as an enum member's value)."""
        return self.kind

    def can(self, capability: str) -> bool:
        """True when checkpoints of this kind have ``capability`` (a :data:`CAPABILITIES` name)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}; known: {sorted(CAPABILITIES)}")
        return capability in self.capabilities

    def __repr__(self) -> str:
        return f"<Kind.{self.member}: {self.kind!r}>"


SPECS: list[FormatSpec] = []
REFUSALS: dict[str, list[Callable[[Probe], None]]] = {MISSING: [], BEFORE_FILES: [], AFTER_FILES: []}


def register(spec: FormatSpec, *, before: str | None = None) -> FormatSpec:
    """Add ``spec`` to the registry, last in detection order or just before the kind ``before``.

    Raises:
        ValueError: A spec of that kind is already registered, or ``before`` is unknown.
    """
    if any(s.kind == spec.kind and s.at == spec.at for s in SPECS):
        raise ValueError(f"format {spec.kind!r} is already registered at {spec.at!r}")
    if before is None:
        SPECS.append(spec)
    else:
        SPECS.insert(SPECS.index(spec_for(before)), spec)
    return spec


def unregister(kind: str) -> None:
    """Remove the specs of ``kind`` (for tests that register a format of their own)."""
    SPECS[:] = [s for s in SPECS if s.kind != kind]


def refusal(phase: str) -> Callable[[Callable[[Probe], None]], Callable[[Probe], None]]:
    """Register a near-miss check for ``phase`` (:data:`MISSING`, :data:`BEFORE_FILES` or
    :data:`AFTER_FILES`), in registration order."""

    def add(fn: Callable[[Probe], None]) -> Callable[[Probe], None]:
        REFUSALS[phase].append(fn)
        return fn

    return add


def capabilities(format_name: str) -> frozenset[str]:
    """What checkpoints of the format ``format_name`` (a ``Checkpoint.format``) can do: the
    capabilities of every spec giving that name; empty for a name no spec gives."""
    found: set[str] = set()
    for spec in SPECS:
        if format_name in spec.formats:
            found |= spec.capabilities
    return frozenset(found)


def spec_for(kind: str) -> FormatSpec:
    """The spec of ``kind`` (its name or :class:`Kind` member).

    Raises:
        KeyError: No such kind.
    """
    name = getattr(kind, "value", kind)
    for spec in SPECS:
        if spec.kind == name:
            return spec
    raise KeyError(f"no format {name!r}")


class _Kinds:
    """``Kind.TF_BUNDLE``...: the registered kinds by member name (each the first spec of its kind)."""

    def __getattr__(self, member: str) -> FormatSpec:
        for spec in SPECS:
            if spec.member == member:
                return spec
        raise AttributeError(f"no format kind {member!r}")

    def __iter__(self):
        seen: set[str] = set()
        for spec in SPECS:
            if spec.kind not in seen:
                seen.add(spec.kind)
                yield spec


Kind = _Kinds()


def kinds() -> list[FormatSpec]:
    """Every registered kind once, in detection order."""
    return list(Kind)


def format_names() -> tuple[str, ...]:
    """Every ``Checkpoint.format`` name a registered format gives, once, in registry order."""
    names: list[str] = []
    for spec in SPECS:
        names.extend(f for f in spec.formats if f not in names)
    return tuple(names)


def described() -> str:
    """Every kind of path the registry recognises, in detection order ("a TF checkpoint prefix
    or its .index file, ..., or a .safetensors file"): the help of PATH arguments."""
    kinds = [spec.describe for spec in SPECS if spec.describe]
    return ", ".join(kinds[:-1]) + " or " + kinds[-1]


def expected() -> str:
    """What a path may be: the "expected ..." text of a refusal, from the registry."""
    return "expected " + described()
