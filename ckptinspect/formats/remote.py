"""Object storage (``s3://``, ``gs://``, ``https://``, ``hf://``...) through fsspec, shaped for latency.

Every format reads remote files through the same file object, :class:`RemoteFile`: a seekable,
read-only ``io.RawIOBase`` over one object, whose bytes come from ranged GETs shared by every
handle opened on the same object in this process (:class:`_Blob`):

* metadata reads (a safetensors header, a TF ``.index``, HDF5 object headers, a zip's central
  directory) are small reads at scattered offsets: each miss fetches a window of at least
  :data:`WINDOW_BYTES` (the last :data:`WINDOW_BYTES` of the object for a read near its end, where
  a zip keeps its directory), kept in a small LRU, so listing a file costs one or two GETs;
* a single large read (a whole tensor) is fetched as its own bytes, in ranges of at most
  :data:`CHUNK_BYTES` all in flight at once;
* a run of reads in storage order (``diff``, ``verify``, ``--stats`` and ``extract`` read that way)
  switches to streaming once :data:`STREAM_RUN_BYTES` have been read in a row: aligned chunks of
  :data:`CHUNK_BYTES`, :data:`AHEAD_CHUNKS` of them in flight on worker threads ahead of the
  reader, each dropped once read through; memory per object stays under ``MAX_CHUNKS * CHUNK_BYTES``;
* nothing is downloaded whole unless every byte is asked for.

What an object store says about names (does it exist, a file or a "directory", its size) comes
from :func:`stat` and :func:`listdir`, cached for :data:`STAT_SECONDS`: on S3 one ``LIST`` of the
name as a prefix answers for the name and every sibling that starts with it (a TF prefix's
``.index`` and data shards, a ``model.safetensors.index.json`` beside its shards), so resolving a
checkpoint costs one request; a directory is listed once.

Endpoints and credentials come from the standard environment (``AWS_ENDPOINT_URL``, ``AWS_*``,
``GOOGLE_APPLICATION_CREDENTIALS``, ``STORAGE_EMULATOR_HOST``...), read by the file system
packages themselves; :func:`redact` keeps their values (and ``user:password@`` in URLs, signed
query strings) out of every message. Transient failures (throttling, a connection lost
mid-read) are retried by the file system package and then here, :data:`ATTEMPTS` times with
backoff; what still fails is one :class:`~ckptinspect.errors.CheckpointNotFoundError` line.

Writes (:func:`upload`) put a finished local file under its key in one request (a single PUT,
or a multipart upload the store only makes visible when it completes): a reader sees the old
object or the new one, never part of one.
"""

from __future__ import annotations

import collections
import io
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..errors import CheckpointNotFoundError, OutputWriteError

if TYPE_CHECKING:  # concurrent.futures only when a remote object is read (local `ls` never imports it)
    import concurrent.futures

__all__ = [
    "WINDOW_BYTES",
    "CHUNK_BYTES",
    "AHEAD_CHUNKS",
    "STAT_SECONDS",
    "EXTRAS",
    "RemoteUnavailable",
    "Stat",
    "filesystem",
    "stat",
    "listdir",
    "walk",
    "warm",
    "forget",
    "clear",
    "open_file",
    "RemoteFile",
    "read_all",
    "upload",
    "remove",
    "redact",
    "describe",
    "request_count",
]

WINDOW_BYTES = 64 << 10  # a metadata miss fetches at least this much...
HEAD_WINDOW_BYTES = 256 << 10  # ...at an object's start this much (a safetensors header of ~2,500 tensors, a TF index of ~2,000)
CHUNK_BYTES = 2 << 20  # streaming reads fetch aligned chunks of this size...
AHEAD_CHUNKS = 4  # ...this many in flight ahead of the reader
MAX_CHUNKS = 2 * (AHEAD_CHUNKS + 2)  # chunks kept per object until read through (two readers: diff's threads)
STREAM_READ_BYTES = 256 << 10  # a read this large streams at once; smaller ones after a sequential run
STREAM_RUN_BYTES = 1 << 20  # bytes read in a row (each read within STREAM_GAP_BYTES of the last) that start streaming
STREAM_GAP_BYTES = 1 << 20
MAX_WINDOWS = 4096
MAX_WINDOW_BYTES = 32 << 20  # metadata windows kept per object
PREFETCH_GAP_BYTES = WINDOW_BYTES  # spans closer than this are fetched in one range (at most CHUNK_BYTES)
MAX_PREFETCH_BYTES = 16 << 20  # fetched by one prefetch call at most (spans past it are read when asked for)
STAT_SECONDS = 5.0  # how long what a store said about a name is believed
ATTEMPTS = 2  # tries of one request here, each after the file system package's own (s3fs: 3 x botocore's 2)
BACKOFF_SECONDS = 0.25
S3FS_RETRIES = 3
WORKERS = 8  # ranged GETs in flight across the process
MAX_BLOBS = 32

# scheme -> (the fsspec package it needs, the ckptinspect extra that installs it)
EXTRAS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "hf": ("huggingface_hub", None),
    "http": ("aiohttp", None),
    "https": ("aiohttp", None),
}

_lock = threading.RLock()
_filesystems: dict[tuple, Any] = {}
_requests = collections.Counter()  # what this process asked stores for, by kind (tests, benchmarks)


class RemoteUnavailable(Exception):
    """No fsspec file system for a scheme (fsspec or the scheme's package is not installed)."""


def scheme(path: str) -> str:
    return path.split("://", 1)[0].lower() if "://" in path else ""


_ENV_KEYS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_DEFAULT_REGION",
             "AWS_REGION", "GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "HF_ENDPOINT", "HF_TOKEN")


def filesystem(path: str) -> Any:
    """The fsspec file system for ``path``'s scheme, one per scheme and environment (a changed
    endpoint or key makes a new one).

    Raises:
        RemoteUnavailable: fsspec, or the package for the scheme, is not installed (the message
            names the package and the extra that installs it).
    """
    name = scheme(path)
    key = (name, tuple(os.environ.get(k) for k in _ENV_KEYS))
    with _lock:
        fs = _filesystems.get(key)
        if fs is not None:
            return fs
        package, extra = EXTRAS.get(name, (None, None))
        hint = (f"pip install 'ckptinspect[{extra}]'" if extra else f"pip install {package}") if package else None
        try:
            import fsspec  # noqa: PLC0415 - remote paths only
        except ImportError:
            raise RemoteUnavailable(f"{name}:// paths need fsspec" + (f" and {package} ({hint})" if hint else "")) from None
        try:
            cls = fsspec.get_filesystem_class(name)
        except (ImportError, ValueError) as e:
            if hint:
                raise RemoteUnavailable(f"{name}:// paths need the {package} package ({hint})") from None
            raise RemoteUnavailable(f"{name}:// paths: {one_line(e)}") from None
        options: dict[str, Any] = {}
        if getattr(cls, "protocol", None) and "s3" in _names(cls.protocol):
            # s3fs reads AWS_ENDPOINT_URL itself only through botocore; say it explicitly so older
            # botocores (before 1.31) use it too. Throttling and 5xx answers: botocore's standard
            # retry mode, bounded.
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint:
                options["endpoint_url"] = endpoint
            options["config_kwargs"] = {"retries": {"max_attempts": 2, "mode": "standard"}}
        try:
            try:
                fs = cls(skip_instance_cache=True, **options)
            except TypeError:
                fs = cls(**options)
        except ImportError as e:  # an implementation whose own package is missing (hdfs:// without pyarrow)
            raise RemoteUnavailable(f"{name}:// paths need the {e.name or 'missing'} package"
                                    + (f" ({hint})" if hint else "")) from None
        if "retries" in options.get("config_kwargs", {}):
            fs.retries = S3FS_RETRIES  # s3fs's own tries of a request cut short (then ours: ATTEMPTS)
        _filesystems[key] = fs
        return fs


def _names(protocol: Any) -> tuple[str, ...]:
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


# -- messages -------------------------------------------------------------------------------
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID",
               "GOOGLE_APPLICATION_CREDENTIALS", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AZURE_STORAGE_KEY")
_URL_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/\s@]+@", re.IGNORECASE)
_SIGNED_QUERY = re.compile(r"([?&](?:X-Amz-[A-Za-z-]+|Signature|AWSAccessKeyId|sig|token|access_token)=)[^&\s'\"]+",
                           re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the environment's secrets, ``user:password@`` in URLs and signed query
    parameters replaced by ``***``."""
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    text = _URL_USERINFO.sub(r"\1***@", text)
    return _SIGNED_QUERY.sub(r"\1***", text)


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return redact(line)[:300]


def describe(path: str, e: BaseException, doing: str = "cannot read") -> str:
    """One line for a store's error about ``path``: no such bucket or key, access denied,
    throttled, else what the store said (secrets removed)."""
    text = one_line(e)
    code = _error_code(e)
    if code in ("NoSuchBucket",) or "bucket does not exist" in text.lower():
        return f"{path}: no such bucket"
    if isinstance(e, FileNotFoundError) or code in ("NoSuchKey", "404", "NotFound"):
        return f"{path}: no such file"
    if isinstance(e, PermissionError) or code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                                                  "ExpiredToken", "InvalidToken"):
        return f"{path}: access denied ({text}); check the credentials in the environment"
    if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "503", "TooManyRequests"):
        return f"{path}: {doing}: the store is throttling requests ({text}); retried {ATTEMPTS} times, try again later"
    return f"{path}: {doing} ({text})"


def _error_code(e: BaseException) -> str | None:
    seen = 0
    while e is not None and seen < 5:
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
        seen += 1
    return None


def _transient(e: BaseException) -> bool:
    """Worth another try: not a missing object, not a refusal."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    code = _error_code(e)
    return code not in ("NoSuchBucket", "NoSuchKey", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                        "InvalidRange", "404", "403", "400", "416")


def _retrying(path: str, call: Callable[[], Any], doing: str = "cannot read") -> Any:
    delay = BACKOFF_SECONDS
    for attempt in range(ATTEMPTS):
        try:
            return call()
        except Exception as e:  # noqa: BLE001 - whatever the store's package raises
            if attempt + 1 < ATTEMPTS and _transient(e):
                time.sleep(delay)
                delay *= 3
                continue
            raise CheckpointNotFoundError(describe(path, e, doing)) from None
    raise AssertionError("unreachable")  # pragma: no cover


# -- names ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stat:
    """What a store says about a name: ``file`` (with its size and tag) or ``dir``."""

    kind: str
    size: int | None = None
    tag: str | None = None


_stats: dict[str, tuple[float, Stat | None]] = {}
_complete: dict[str, float] = {}  # prefixes whose every (direct) key is in _stats, until when


def _key(fs: Any, path: str) -> str:
    return fs._strip_protocol(path).rstrip("/")


def _record(fs: Any, entry: dict, until: float) -> None:
    name = _key(fs, entry["name"])
    kind = "dir" if entry.get("type") == "directory" else "file"
    size = entry.get("size") if kind == "file" else None
    tag = entry.get("ETag") or entry.get("etag") or entry.get("md5Hash") or entry.get("LastModified") or entry.get("mtime")
    _stats[name] = (until, Stat(kind, int(size) if size is not None else None, str(tag) if tag is not None else None))


def _known(name: str, now: float) -> tuple[bool, Stat | None]:
    hit = _stats.get(name)
    if hit is not None and hit[0] > now:
        return True, hit[1]
    for prefix, until in _complete.items():
        if until > now and name.startswith(prefix) and "/" not in name[len(prefix.rpartition("/")[0]) + 1:]:
            if hit is None or hit[0] <= now:
                return True, None
    return False, None


def stat(path: str) -> Stat | None:
    """What the store says about ``path`` (None: nothing there), cached for :data:`STAT_SECONDS`.

    Raises:
        CheckpointNotFoundError: The store cannot be asked (no such bucket, access denied, no
            network), in one line.
        RemoteUnavailable: No file system for the scheme.
    """
    fs = filesystem(path)
    name = _key(fs, path)
    now = time.monotonic()
    with _lock:
        known, value = _known(name, now)
    if known:
        return value
    until = now + STAT_SECONDS
    parent, _, stem = name.rpartition("/")
    if hasattr(fs, "_lsdir") and parent and stem:  # s3fs: one LIST of the name as a prefix
        from fsspec.asyn import sync  # noqa: PLC0415 - s3fs is an fsspec async file system

        def listing() -> list[dict]:
            _requests["list"] += 1
            return sync(fs.loop, fs._lsdir, parent, prefix=stem, refresh=True)

        entries = _retrying(path, listing, "cannot list")
        with _lock:
            for entry in entries:
                _record(fs, entry, until)
            hit = _stats.get(name)
            if hit is None or hit[0] != until:  # not in this listing: nothing by that name
                _stats[name] = (until, None)
            _complete[name] = until
            value = _stats[name][1]
        if value is not None and value.kind == "dir":
            listdir(path)  # whoever asks about a directory looks inside next: one listing answers it all
        return value

    if _is_http(fs):  # one ranged GET: the size and the first window together (a HEAD would cost a request too)
        value = _retrying(path, lambda: _http_stat(fs, path, name), "cannot access")
        if value is not _UNKNOWN:
            with _lock:
                _stats[name] = (until, value)
            return value

    def info() -> Stat | None:
        _requests["info"] += 1
        try:
            entry = fs.info(path)
        except FileNotFoundError:
            return None
        with _lock:
            _record(fs, entry, until)
            return _stats[_key(fs, entry["name"])][1]

    value = _retrying(path, info, "cannot access")
    with _lock:
        _stats[name] = (until, value)
    return value


_UNKNOWN = Stat("unknown")  # _http_stat could not tell (fs.info asks instead)
_heads: dict[str, tuple[Stat, bytes]] = {}  # an object's first window, fetched with its size (http)


def _is_http(fs: Any) -> bool:
    return bool({"http", "https"} & set(_names(getattr(fs, "protocol", ())))) and hasattr(fs, "set_session")


def _http_stat(fs: Any, path: str, name: str) -> Stat | None:
    """What an HTTP server says about ``path`` from one GET of its first :data:`HEAD_WINDOW_BYTES`
    (``Range: bytes=0-...``): None for 404/410; the size from ``Content-Range`` (a 206) and the
    bytes kept as the object's first window. A server that answers 200 (no ranges) is answered
    by its ``Content-Length`` without reading the body. :data:`_UNKNOWN` when the answer does not
    say the size (fsspec's ``info`` decides then)."""
    from fsspec.asyn import sync  # noqa: PLC0415 - fsspec's HTTP file system is asynchronous

    async def probe() -> Stat | None:
        session = await fs.set_session()
        options = dict(fs.kwargs)
        headers = {**options.pop("headers", {}), "Range": f"bytes=0-{HEAD_WINDOW_BYTES - 1}", "Accept-Encoding": "identity"}
        _requests["get"] += 1
        async with session.get(fs.encode_url(path), headers=headers, **options) as r:
            if r.status in (404, 410):
                return None
            if r.status in (401, 403):
                raise PermissionError(f"HTTP {r.status}")
            r.raise_for_status()
            if r.headers.get("Content-Encoding", "identity") not in ("identity", ""):
                return _UNKNOWN
            tag = r.headers.get("ETag") or r.headers.get("Last-Modified")
            if r.status == 206:
                total = (r.headers.get("Content-Range") or "").rpartition("/")[2]
                if not total.isdigit():
                    return _UNKNOWN
                data = await r.read()
                info = Stat("file", int(total), tag)
                if len(data) == min(HEAD_WINDOW_BYTES, info.size or 0):
                    with _lock:
                        _heads[name] = (info, data)
                return info
            length = r.headers.get("Content-Length")
            r.close()  # the whole object would follow: never read it here
            return Stat("file", int(length), tag) if r.status == 200 and length and length.isdigit() else _UNKNOWN

    return sync(fs.loop, probe)


def listdir(path: str) -> list[str]:
    """The names directly inside remote directory ``path`` (one listing, remembered by :func:`stat`)."""
    fs = filesystem(path)
    name = _key(fs, path)
    now = time.monotonic()
    until = now + STAT_SECONDS
    with _lock:
        if _complete.get(name + "/", 0) > now:  # listed a moment ago
            return sorted(k[len(name) + 1:] for k, (t, v) in _stats.items()
                          if v is not None and t > now and k.startswith(name + "/") and "/" not in k[len(name) + 1:])

    def listing() -> list[dict]:
        _requests["list"] += 1
        try:
            return fs.ls(path, detail=True, refresh=True)
        except TypeError:
            return fs.ls(path, detail=True)

    entries = _retrying(path, listing, "cannot list")
    names = []
    with _lock:
        for entry in entries:
            if _key(fs, entry["name"]) == name:
                continue
            _record(fs, entry, until)
            names.append(_key(fs, entry["name"]).rpartition("/")[2])
        _stats[name] = (until, Stat("dir"))
        _complete[name + "/"] = until
    return sorted(names)


def walk(path: str, limit: int) -> list[tuple[str, int]] | None:
    """Every object under remote folder ``path``, each as (path, size) sorted, from one recursive
    listing (no delimiter: one request per 1,000 keys on S3), remembered as :func:`stat` and
    :func:`listdir` remember theirs (every folder under ``path`` listed complete), so what a
    reader asks next about names inside (exists, is it a folder, its size, a folder's names)
    costs no request. At most ``limit`` objects: ``None`` when there are more.

    Raises:
        CheckpointNotFoundError: The store cannot be asked (one line).
        RemoteUnavailable: No file system for the scheme.
    """
    fs = filesystem(path)
    root = _key(fs, path)
    until = time.monotonic() + STAT_SECONDS

    def listing() -> dict:
        _requests["list"] += 1
        invalidate = getattr(fs, "invalidate_cache", None)
        if invalidate is not None:
            invalidate(path)
        return fs.find(path, detail=True, withdirs=False)

    entries = _retrying(path, listing, "cannot list")
    if len(entries) > limit:
        return None
    base = path.rstrip("/")
    out: list[tuple[str, int]] = []
    with _lock:
        folders = {root}
        for entry in entries.values():
            name = _key(fs, entry["name"])
            if not name.startswith(root + "/") or entry.get("type") == "directory":
                continue
            _record(fs, entry, until)
            rel = name[len(root) + 1:]
            up = rel.rpartition("/")[0]
            while up:
                folders.add(f"{root}/{up}")
                up = up.rpartition("/")[0]
            out.append((f"{base}/{rel}", int(entry.get("size") or 0)))
        for folder in folders:
            _stats[folder] = (until, Stat("dir"))
            _complete[folder + "/"] = until
    return sorted(out)


def warm(paths: list[str]) -> None:
    """Fetch the first window of each of ``paths`` (small files a reader is about to read whole:
    metadata, manifests), all in flight at once: the reads that follow are answered from memory,
    one round trip for them all instead of one each. What fails here is left for those reads to
    report. At most :data:`MAX_BLOBS` // 2 paths (the rest are read as they come)."""
    def fetch(path: str) -> None:
        try:
            _blob(path).window(0, HEAD_WINDOW_BYTES)
        except Exception:  # noqa: BLE001 - the reader's own read says what is wrong
            pass

    futs = [_executor().submit(fetch, p) for p in paths[: MAX_BLOBS // 2]]
    for fut in futs:
        fut.result()


def forget(path: str) -> None:
    """Drop what is remembered about ``path`` and its parent's listings (after a write)."""
    try:
        fs = filesystem(path)
    except RemoteUnavailable:
        return
    name = _key(fs, path)
    parent = name.rpartition("/")[0]
    with _lock:
        ancestors = set()
        up = name
        while "/" in up:
            up = up.rpartition("/")[0]
            ancestors.add(up)
        for k in [k for k in _stats if k.startswith(name) or k in ancestors]:  # a new key makes its folders
            del _stats[k]
        for k in [k for k in _complete if name.startswith(k.rstrip("/")) or k.startswith(parent)]:
            del _complete[k]
        _blobs.pop(name, None)
        _heads.pop(name, None)
    invalidate = getattr(fs, "invalidate_cache", None)
    if invalidate is not None:
        invalidate(parent)


def clear() -> None:
    """Forget every remembered name and fetched byte (tests; a long-lived process that must see
    a change at once)."""
    with _lock:
        _stats.clear()
        _complete.clear()
        _blobs.clear()
        _heads.clear()
        _filesystems.clear()


def request_count() -> dict[str, int]:
    """Requests this process made through this module, by kind (``list``, ``info``, ``get``, ``put``)."""
    return dict(_requests)


# -- reading --------------------------------------------------------------------------------
_pool: "concurrent.futures.ThreadPoolExecutor | None" = None


def _executor() -> "concurrent.futures.ThreadPoolExecutor":
    global _pool
    with _lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - remote reads only

            _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="ckptinspect-remote")
        return _pool


class _Blob:
    """The bytes of one remote object as this process has fetched them: metadata windows and
    streaming chunks, shared by every :class:`RemoteFile` opened on it."""

    def __init__(self, fs: Any, path: str, size: int, tag: str | None):
        self.fs = fs
        self.path = path
        self.size = size
        self.tag = tag
        self._windows: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._chunks: collections.OrderedDict[int, concurrent.futures.Future] = collections.OrderedDict()
        self._runs: collections.OrderedDict[int, int] = collections.OrderedDict()  # end of a run of reads -> its bytes
        self._consumed: dict[int, int] = {}  # chunk -> bytes read from it so far
        self._lock = threading.Lock()

    def note(self, offset: int, n: int) -> int:
        """Record a read; returns the bytes of the run of reads in storage order it continues
        (several runs are followed at once: ``diff`` reads two variables of a file in two threads)."""
        with self._lock:
            run = 0
            for end in reversed(self._runs):
                if 0 <= offset - end <= STREAM_GAP_BYTES:
                    run = self._runs.pop(end)
                    break
            self._runs[offset + n] = run + n
            while len(self._runs) > 8:
                self._runs.popitem(last=False)
            return run + n

    def get(self, start: int, end: int) -> bytes:
        """Bytes [start, end) in one ranged GET (retried)."""
        def call() -> bytes:
            _requests["get"] += 1
            return self.fs.cat_file(self.path, start=start, end=end)

        data = _retrying(self.path, call)
        if len(data) != end - start:
            raise CheckpointNotFoundError(
                f"{self.path}: the store returned {len(data)} bytes for a range of {end - start}"
                " (the object changed while it was read?)")
        return data

    # metadata windows
    def _from_windows(self, offset: int, end: int) -> bytes | None:
        for start, data in reversed(self._windows.items()):
            if start <= offset and end <= start + len(data):
                self._windows.move_to_end(start)
                return data[offset - start : end - start]
        return None

    def window(self, offset: int, n: int) -> bytes:
        end = min(self.size, offset + n)
        with self._lock:
            hit = self._from_windows(offset, end)
            if hit is None:
                hit = self._from_chunks_ready(offset, end)
        if hit is not None:
            return hit
        if end > self.size - WINDOW_BYTES:  # near the end: the tail (a zip's directory, HDF5's last object)
            start, stop = max(0, min(offset, self.size - WINDOW_BYTES)), self.size
        else:
            start, stop = offset, min(self.size, offset + max(n, HEAD_WINDOW_BYTES if offset == 0 else WINDOW_BYTES))
        data = self.get(start, stop)
        self._keep(start, data)
        return data[offset - start : end - start]

    def _keep(self, start: int, data: bytes) -> None:
        with self._lock:
            self._windows[start] = data
            self._window_bytes = getattr(self, "_window_bytes", 0) + len(data)
            while len(self._windows) > MAX_WINDOWS or self._window_bytes > MAX_WINDOW_BYTES:
                self._window_bytes -= len(self._windows.popitem(last=False)[1])

    def prefetch(self, spans: list[tuple[int, int]], at_least: int = 0) -> None:
        """Fetch the (offset, size) spans not in memory yet, all at once (near ones in one range,
        several ranges in flight): a reader that knows where its metadata lies (an archive's
        member headers, the object headers of a group's children) asks for it in one round trip
        instead of one per span. Each range fetched covers at least ``at_least`` bytes from its
        span's start (a window for the reads around an address whose size the reader does not
        know yet)."""
        todo = []
        with self._lock:
            for offset, n in sorted(spans):
                end = min(self.size, offset + n)
                if end > offset and self._from_windows(offset, end) is None:
                    todo.append((offset, min(self.size, max(end, offset + at_least))))
        merged: list[list[int]] = []
        total = 0
        for start, end in todo:
            if merged and start - merged[-1][1] <= PREFETCH_GAP_BYTES and end - merged[-1][0] <= CHUNK_BYTES:
                grown = max(merged[-1][1], end) - merged[-1][1]
                if total + grown > MAX_PREFETCH_BYTES:
                    break
                merged[-1][1] += grown
                total += grown
            else:
                if total + end - start > MAX_PREFETCH_BYTES:
                    break  # the rest is read as it comes (memory: what one call fetches is held until kept)
                merged.append([start, end])
                total += end - start
        futs = [(start, _executor().submit(self.get, start, end)) for start, end in merged]
        for start, fut in futs:
            self._keep(start, fut.result())

    # streaming chunks
    def _chunk_future(self, index: int) -> concurrent.futures.Future:
        fut = self._chunks.get(index)
        if fut is None:
            start = index * CHUNK_BYTES
            fut = self._chunks[index] = _executor().submit(self.get, start, min(self.size, start + CHUNK_BYTES))
        else:
            self._chunks.move_to_end(index)
        return fut

    def _from_chunks_ready(self, offset: int, end: int) -> bytes | None:
        first, last = offset // CHUNK_BYTES, max(offset, end - 1) // CHUNK_BYTES
        futs = [self._chunks.get(i) for i in range(first, last + 1)]
        if any(f is None or not f.done() or f.exception() is not None for f in futs):
            return None
        return self._join(futs, offset, end, first)  # type: ignore[arg-type]

    @staticmethod
    def _join(futs: list[concurrent.futures.Future], offset: int, end: int, first: int) -> bytes:
        parts = []
        for i, fut in enumerate(futs):
            data = fut.result()
            base = (first + i) * CHUNK_BYTES
            parts.append(data[max(0, offset - base) : end - base])
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def stream(self, offset: int, n: int) -> bytes:
        end = min(self.size, offset + n)
        if end <= offset:
            return b""
        first, last = offset // CHUNK_BYTES, (end - 1) // CHUNK_BYTES
        stop = min((self.size - 1) // CHUNK_BYTES, last + AHEAD_CHUNKS)
        with self._lock:
            futs = [self._chunk_future(i) for i in range(first, last + 1)]
            for i in range(last + 1, stop + 1):  # read ahead, in storage order
                self._chunk_future(i)
            for index in list(self._chunks):  # a bound for chunks read ahead that nobody came for
                if len(self._chunks) <= MAX_CHUNKS:
                    break
                if index < first or index > stop:
                    self._drop(index)  # never cancelled: another reader may wait on it
        data = self._join(futs, offset, end, first)
        with self._lock:  # a chunk whose every byte was read is done with (reads in storage order)
            for index in range(first, last + 1):
                base = index * CHUNK_BYTES
                got = self._consumed.get(index, 0) + min(end, base + CHUNK_BYTES) - max(offset, base)
                if got >= min(CHUNK_BYTES, self.size - base):
                    self._drop(index)
                elif index in self._chunks:
                    self._consumed[index] = got
        return data

    def _drop(self, index: int) -> None:
        self._chunks.pop(index, None)
        self._consumed.pop(index, None)

    def exact(self, offset: int, n: int) -> bytes:
        """Bytes [offset, offset + n) in ranged GETs of at most :data:`CHUNK_BYTES`, all in flight
        at once (a single large read: no read-ahead past it)."""
        end = min(self.size, offset + n)
        with self._lock:
            hit = self._from_chunks_ready(offset, end)
        if hit is not None:
            return hit
        bounds = [(s, min(end, s + CHUNK_BYTES)) for s in range(offset, end, CHUNK_BYTES)]
        if len(bounds) == 1:
            return self.get(*bounds[0])
        futs = [_executor().submit(self.get, s, e) for s, e in bounds]
        return b"".join(f.result() for f in futs)


_blobs: collections.OrderedDict[str, _Blob] = collections.OrderedDict()


def _blob(path: str) -> _Blob:
    fs = filesystem(path)
    info = stat(path)
    if info is None:
        raise CheckpointNotFoundError(f"{path}: no such file")
    if info.kind == "dir":
        raise CheckpointNotFoundError(f"{path}: is a directory, not a file")
    name = _key(fs, path)
    with _lock:
        blob = _blobs.get(name)
        if blob is None or blob.size != info.size or blob.tag != info.tag:
            blob = _blobs[name] = _Blob(fs, path, int(info.size or 0), info.tag)
            head = _heads.pop(name, None)
            if head is not None and head[0] == info:  # fetched with the size (http): the first window
                blob._keep(0, head[1])
        _blobs.move_to_end(name)
        while len(_blobs) > MAX_BLOBS:
            _blobs.popitem(last=False)
        return blob


class RemoteFile(io.RawIOBase):
    """A seekable read-only file over a remote object (see the module's docstring); ``size`` is
    the object's size. Handles are cheap: the fetched bytes belong to the object, not the handle.
    ``pread`` is safe from several threads; ``seek``/``read`` keep a position like any file."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self._blob = _blob(path)
        self.size = self._blob.size
        self.name = path
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(22, "negative seek position")
        self._pos = pos
        return pos

    def pread(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer at the end of the object)."""
        if n <= 0 or offset >= self.size:
            return b""
        n = min(n, self.size - offset)
        run = self._blob.note(offset, n)
        if run >= STREAM_RUN_BYTES:  # reading on in storage order: stream, read ahead
            return self._blob.stream(offset, n)
        if n >= STREAM_READ_BYTES:  # one large read: its own bytes, in parallel ranges
            return self._blob.exact(offset, n)
        return self._blob.window(offset, n)

    def prefetch(self, spans: list[tuple[int, int]], at_least: int = 0) -> None:
        """See :meth:`_Blob.prefetch`."""
        self._blob.prefetch(spans, at_least)

    def read(self, n: int = -1) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if n is None or n < 0:
            n = max(0, self.size - self._pos)
        data = self.pread(self._pos, n)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)


def open_file(path: str) -> RemoteFile:
    """A :class:`RemoteFile` for ``path``.

    Raises:
        CheckpointNotFoundError: No such object (or a directory), or the store cannot be asked.
        RemoteUnavailable: No file system for the scheme.
    """
    return RemoteFile(path)


def read_all(path: str) -> bytes:
    """Every byte of a remote object (a small one: an index, a state file; large ones stream)."""
    with RemoteFile(path) as f:
        return f.pread(0, f.size)


# -- writing --------------------------------------------------------------------------------
def upload(local: str, path: str) -> None:
    """Put local file ``local`` at remote ``path``: one PUT, or a multipart upload the store
    shows only once complete; either way the object appears whole or not at all.

    Raises:
        OutputWriteError: The store refused or the connection failed (one line).
    """
    fs = filesystem(path)

    def put() -> None:
        _requests["put"] += 1
        fs.put_file(local, path)

    try:
        _retrying(path, put, "cannot write")
    except CheckpointNotFoundError as e:
        raise OutputWriteError(str(e)) from None
    finally:
        forget(path)


def remove(path: str) -> None:
    """Delete remote ``path`` (missing is fine)."""
    fs = filesystem(path)
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass
    except Exception as e:  # noqa: BLE001 - whatever the store's package raises
        raise OutputWriteError(describe(path, e, "cannot delete")) from None
    finally:
        forget(path)
