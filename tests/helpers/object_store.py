"""A real S3-compatible server for tests (moto's server, a subprocess on 127.0.0.1) and a TCP
proxy in front of it that delays each request, counts requests and can cut responses short.

Nothing is mocked: ckptinspect talks HTTP to the proxy, the proxy to moto's server, through
s3fs and botocore as it would to AWS; the endpoint and the (dummy) credentials come from the
standard environment variables.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Iterator

DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "s3cr3t-never-printed-7f3a",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """Start ``python -m moto.server`` on a free port of 127.0.0.1; yields its endpoint URL."""
    port = free_port()
    env = {**os.environ, **DUMMY_ENV, **(extra_env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``).

    HTTP/1.1 without pipelining: on each connection a request is what the client sends after
    the server last answered, so each one is counted (``requests``, by method in ``methods``) and
    held ``delay`` seconds before it is forwarded (a store's round trip). ``cut(n)`` makes the
    next ``n`` responses stop after their first bytes, the connection closed (a connection lost
    mid-read). ``bandwidth`` (bytes/s) caps each connection's answers, as a store's single stream.
    ``most_in_flight``: the most requests sent and not yet answered at one moment (reads one
    after another: 1; ranges fetched together: more).
    """

    def __init__(self, upstream: str, delay: float = 0.0, bandwidth: float = 0.0, listen_port: int = 0):
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.delay = delay
        self.bandwidth = bandwidth  # bytes per second per connection (0: unlimited), a store's single-stream rate
        self.requests = 0
        self.methods: dict[str, int] = {}
        self.lines: list[str] = []  # each request's first line
        self.bytes_out = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self._cuts = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", listen_port))
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        with self._lock:
            self.requests = 0
            self.methods = {}
            self.lines = []
            self.bytes_out = 0
            self.most_in_flight = self.in_flight

    def cut(self, n: int) -> None:
        with self._lock:
            self._cuts = n

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        state = {"new": True, "cut": False, "waiting": False}

        def up() -> None:  # client -> server: a burst after an answer is a new request
            try:
                while True:
                    data = client.recv(1 << 16)
                    if not data:
                        break
                    if state["new"]:
                        state["new"] = False
                        method = data.split(b" ", 1)[0].decode("latin-1")
                        with self._lock:
                            self.requests += 1
                            self.methods[method] = self.methods.get(method, 0) + 1
                            self.lines.append(data.split(b"\r\n", 1)[0].decode("latin-1"))
                            state["waiting"] = True
                            self.in_flight += 1
                            self.most_in_flight = max(self.most_in_flight, self.in_flight)
                            if self._cuts > 0 and method == "GET":
                                self._cuts -= 1
                                state["cut"] = True
                        if self.delay:
                            time.sleep(self.delay)
                    upstream.sendall(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    upstream.shutdown(socket.SHUT_WR)

        def down() -> None:  # server -> client
            try:
                while True:
                    data = upstream.recv(1 << 16)
                    if not data:
                        break
                    state["new"] = True
                    if state["waiting"]:  # the first bytes of the answer
                        with self._lock:
                            state["waiting"] = False
                            self.in_flight -= 1
                    if state["cut"]:  # the headers and a few bytes, then the connection drops
                        client.sendall(data[: min(len(data), 600)])
                        break
                    with self._lock:
                        self.bytes_out += len(data)
                    client.sendall(data)
                    if self.bandwidth:
                        time.sleep(len(data) / self.bandwidth)
            except OSError:
                pass
            finally:
                if state["waiting"]:  # never answered
                    with self._lock:
                        state["waiting"] = False
                        self.in_flight -= 1
                for s in (client, upstream):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                    s.close()

        threading.Thread(target=up, daemon=True).start()
        threading.Thread(target=down, daemon=True).start()


def run_counted(s3, *args: str, delay: float = 0.02) -> tuple[subprocess.CompletedProcess, int]:
    """``ckptinspect ARGS`` in a fresh process against the store of fixture ``s3`` (its ``env``),
    through its proxy delaying each request by ``delay`` seconds: the result and the requests
    the proxy counted."""
    s3.proxy.delay = delay
    s3.proxy.reset()
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", *args], env=s3.env, capture_output=True, text=True,
                          timeout=120)
    return proc, s3.proxy.requests


def upload_tree(endpoint: str, local: pathlib.Path, remote: str) -> None:
    """Copy a local file or folder to ``s3://remote`` with boto3 (the bucket is created)."""
    import boto3  # noqa: PLC0415

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    bucket, _, key = remote.partition("/")
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        s3.create_bucket(Bucket=bucket)
    if local.is_file():
        s3.upload_file(str(local), bucket, key)
        return
    for path in sorted(local.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{key}/{path.relative_to(local).as_posix()}".lstrip("/"))
