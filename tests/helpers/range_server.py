"""A real HTTP server on 127.0.0.1 that answers ranged GETs (``Range: bytes=a-b`` -> 206 with
``Content-Range``), as object stores and the Hugging Face Hub do over HTTPS: what ``http://`` and
``https://`` paths read through (fsspec's HTTP file system). Python's own ``http.server`` ignores
``Range``; this handler honours it, and counts the requests it answers."""

from __future__ import annotations

import functools
import http.server
import os
import re
import threading


HOLD_MIN_BYTES = 1 << 16  # ranged reads up to this size are metadata windows (formats/remote.py)


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Files under the server's directory, whole (200) or by one byte range (206); 404 for a
    directory or a missing file (an object store has no directories to list over HTTP)."""

    requests = 0  # answered so far, by every handler of the process
    _count_lock = threading.Lock()
    hold_from: int | None = None  # ranges starting at or past this offset wait for `released`
    hold_name = ""  # ... of files whose name ends so
    released = threading.Event()
    held = threading.Event()  # set once a request has been held

    def log_message(self, *args) -> None:  # quiet: the tests read their own output
        pass

    def send_head(self):
        with RangeHandler._count_lock:
            RangeHandler.requests += 1
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        size = os.path.getsize(path)
        wanted = re.match(r"bytes=(\d*)-(\d*)$", self.headers.get("Range") or "")
        f = open(path, "rb")  # noqa: SIM115 - closed by the base class after copyfile
        if wanted:
            first, last = wanted.groups()
            if first == "":
                start, end = max(0, size - int(last)), size - 1
            else:
                start, end = int(first), min(int(last) if last else size - 1, size - 1)
            if start >= size:
                f.close()
                self.send_error(416)
                return None
            if (self.hold_from is not None and start >= self.hold_from and path.endswith(self.hold_name)
                    and end - start + 1 > HOLD_MIN_BYTES):
                self.held.set()
                self.released.wait(120)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            f.seek(start)
        else:
            start, end = 0, size - 1
            self.send_response(200)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._left = end - start + 1
        return f

    def copyfile(self, source, outputfile) -> None:
        left = self._left
        while left > 0:
            block = source.read(min(left, 1 << 16))
            if not block:
                break
            outputfile.write(block)
            left -= len(block)


class HoldingHandler(RangeHandler):
    """A :class:`RangeHandler` whose ranged reads of tensor data (over :data:`HOLD_MIN_BYTES`;
    metadata windows pass) of files named ``...hold_name`` from offset ``hold_from`` on wait until
    the test sets ``released`` (at most 120 s): a command reading there is caught mid-read,
    whatever the machine's speed. Set both per test (:meth:`hold`)."""

    hold_from = 0
    released = threading.Event()
    held = threading.Event()

    @classmethod
    def hold(cls, name: str, offset: int) -> None:
        """Hold the reads of files named ``...name`` from ``offset`` on, until ``released``."""
        cls.hold_name, cls.hold_from = name, offset
        cls.released.clear()
        cls.held.clear()


def serve(root: str, handler: type[RangeHandler] = RangeHandler) -> http.server.ThreadingHTTPServer:
    """Serve ``root`` on 127.0.0.1 (a free port: ``server.server_address[1]``) until ``shutdown()``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=root))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
