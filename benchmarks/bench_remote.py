"""Benchmark: checkpoints on object storage (issue 29), against real servers on 127.0.0.1.

Two stores, each behind a TCP proxy that holds each request ``--latency-ms`` (default 20 ms: a
store's round trip) and counts requests (``tests/helpers/object_store.py``):

* ``--store http`` (default): an HTTP server answering ranged GETs (``tests/helpers/range_server.py``,
  as object stores and the Hugging Face Hub answer ``https://``), read through fsspec's HTTP file
  system. It serves the 1 GB files of ``benchmarks/run.py``'s work folder (the TF pair, the torch
  set's .safetensors and .pt) and this script's 256 MB .h5 / .npz, through symbolic links in
  ``WORK/remote_http/`` (nothing is copied). ``run.py`` times these rows too (``ls-remote-*``,
  ``diff-remote-*``; :func:`http_pairs`).
* ``--store moto``: moto's S3 server (s3fs, botocore); files of about ``--size-mb`` MB written
  here. Caveat, measured: moto copies the whole object for every GET, ranged or not (its
  ``FakeKey.value``): a 64 KiB range of a 256 MB object takes 180 ms there against 30 ms for a
  32 MB one, so times of many ranged requests on large objects say little about a real store;
  request counts are what it measures well.

Timed, as whole processes: ``ckptinspect ls`` of each format, wall time and requests (targets: at
most 3 requests for a safetensors file and for a TF bundle's index); ``ckptinspect diff`` of two
remote TF bundles and two remote safetensors files against fsspec's plain ``open().read()`` of
both (the data files for TF) and a byte comparison (target: ckptinspect at least 3x faster);
and the link itself (:func:`link_profile`: one request's round trip, one stream's bandwidth,
eight streams'), which bounds what any reader can gain over one plain read per file.
``tf.io.gfile`` has no ``s3://`` or ``https://`` file system in TensorFlow 2.16+ (tensorflow-io),
so it is not timed.

    python benchmarks/bench_remote.py [--store http|moto] [--work DIR] [--size-mb 1024] [--variables 2000]
                                      [--rounds 3] [--latency-ms 20] [--mbps-per-connection 0]

Needs fsspec and aiohttp (http), moto's server and s3fs (moto), safetensors and h5py. Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
import _common  # noqa: E402 - the shared timing helpers beside this script

TARGET_LS_REQUESTS = 3
TARGET_DIFF_RATIO = 3.0

PLAIN_READ = """
import sys, fsspec, numpy as np
fs = fsspec.filesystem(sys.argv[1].split("://")[0])
del sys.argv[1]
pairs = [p.split("|") for p in sys.argv[1:]]
for a, b in pairs:
    x = fs.open(a, "rb").read()
    y = fs.open(b, "rb").read()
    n = min(len(x), len(y)) // 4 * 4
    d = np.frombuffer(x[:n], np.uint8) != np.frombuffer(y[:n], np.uint8)
    print(a, int(d.sum()))
"""


# -- the http store: run.py's 1 GB files served through links ------------------------------------
H5_NPZ_MB, H5_NPZ_VARIABLES = 256, 200  # this script's own .h5 / .npz (make_files), served beside the 1 GB files


def http_sources(work: pathlib.Path, size_mb: int, variables: int) -> dict[str, pathlib.Path]:
    """What the http store serves (name under its root -> the file in the work folder): run.py's
    TF pair (A, and B with every 4th tensor perturbed), the torch set's .safetensors (under two
    names: the same bytes, for diff) and .pt, and this script's .h5 / .npz."""
    tf = work / f"{size_mb}mb_{variables}v"
    torch = work / f"torch_{size_mb}mb_{variables}v"
    own = work / "remote"
    out = {}
    for tag in ("a", "b"):
        for f in (tf / tag).glob("ckpt.*") if (tf / tag).is_dir() else ():
            out[f"tf_{tag}/{f.name}"] = f
    out |= {"st_a.safetensors": torch / "model.safetensors", "st_b.safetensors": torch / "model.safetensors",
            "model.pt": torch / "model.pt",
            "model.weights.h5": own / f"h5_{H5_NPZ_MB}mb_{H5_NPZ_VARIABLES}v.weights.h5",
            "model.npz": own / f"npz_{H5_NPZ_MB}mb_{H5_NPZ_VARIABLES}v.npz"}
    return {k: v for k, v in out.items() if v.is_file()}


def link_tree(root: pathlib.Path, sources: dict[str, pathlib.Path]) -> pathlib.Path:
    """``root`` holding a symbolic link per served name (made again each run)."""
    for name, target in sources.items():
        link = root / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target.resolve())
    return root


@contextlib.contextmanager
def http_store(root: pathlib.Path, latency_ms: float, mbps: float = 0.0, port: int = 0):
    """The range server on ``root`` behind the delaying, counting proxy (on ``port``; 0: any)."""
    import range_server  # noqa: PLC0415 - tests/helpers
    from object_store import Proxy  # noqa: PLC0415

    server = range_server.serve(str(root))
    proxy = Proxy(f"http://127.0.0.1:{server.server_address[1]}", delay=latency_ms / 1000, bandwidth=mbps * 1e6, listen_port=port)
    try:
        yield proxy
    finally:
        proxy.close()
        server.shutdown()
        server.server_close()


LS_ROWS = {"tf": "tf_a/ckpt", "safetensors": "st_a.safetensors", "pt": "model.pt", "h5": "model.weights.h5", "npz": "model.npz"}
DIFF_ROWS = {"tf": ("tf_a/ckpt", "tf_b/ckpt", ".data-00000-of-00001"), "safetensors": ("st_a.safetensors", "st_b.safetensors", "")}
LS_REQUEST_TARGETS = {"tf": TARGET_LS_REQUESTS, "safetensors": TARGET_LS_REQUESTS}


def http_pairs(base: str, sources: dict[str, pathlib.Path], every: bool = False
               ) -> dict[str, tuple[str, str, list[tuple[str, list[str], bool, tuple[int, ...]]]]]:
    """run.py's remote pairs on the http store at ``base`` (``http://127.0.0.1:PORT/``): id ->
    (command, title, [(label, argv, ours, ok exit codes)]); those whose files are missing are
    left out, unless ``every`` (run.py names them before the files are generated)."""
    ck = [sys.executable, "-m", "ckptinspect"]
    out = {}
    for kind, name in LS_ROWS.items():
        found = [k for k in sources if k.startswith(name)]
        if not found and not every:
            continue
        what = f" ({sum(sources[k].stat().st_size for k in found) / 2**20:.0f} MiB)" if found else ""
        out[f"ls-remote-{kind}"] = ("ls", f"ls of a {kind} checkpoint{what} over http ranged GETs, each request held"
                                    " LATENCY ms by the proxy", [("ckptinspect ls", [*ck, "ls", base + name], True, (0,))])
    for kind, (a, b, data) in DIFF_ROWS.items():
        if (not any(k.startswith(a) for k in sources) or not any(k.startswith(b) for k in sources)) and not every:
            continue
        plain = [sys.executable, "-c", PLAIN_READ, base.split("://")[0], f"{base}{a}{data}|{base}{b}{data}"]
        note = " (the same bytes under two names)" if kind == "safetensors" else ""
        out[f"diff-remote-{kind}"] = ("diff", f"diff of two 1 GB {kind} checkpoints{note} over http ranged GETs, each request held LATENCY ms",
                                      [("ckptinspect diff", [*ck, "diff", base + a, base + b, "-q"], True, (0, 1)),
                                       ("fsspec open().read() of both + numpy compare", plain, False, (0,))])
    return out


LINK_PROBE = """
import sys, time, threading, urllib.request
url, size = sys.argv[1], int(sys.argv[2])
def get(a, b):
    r = urllib.request.urlopen(urllib.request.Request(url, headers={"Range": f"bytes={a}-{b - 1}"}))
    n = 0
    while True:
        block = r.read(1 << 20)
        if not block:
            return n
        n += len(block)
t = time.perf_counter(); [get(0, 1) for _ in range(5)]; rtt = (time.perf_counter() - t) / 5
part = min(size, 256 << 20)
t = time.perf_counter(); get(0, part); one = part / (time.perf_counter() - t)
step = part // 8
threads = [threading.Thread(target=get, args=(i * step, (i + 1) * step)) for i in range(8)]
t = time.perf_counter(); [x.start() for x in threads]; [x.join() for x in threads]; eight = 8 * step / (time.perf_counter() - t)
print(rtt, one, eight)
"""


def link_profile(url: str, size: int, env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """The link to the store, measured: one request's round trip (s, a 1-byte range, five in a
    row), one stream's bandwidth and eight parallel streams' (bytes/s, over 256 MiB)."""
    out = subprocess.run([sys.executable, "-c", LINK_PROBE, url, str(size)], capture_output=True, text=True, check=True, env=env)
    rtt, one, eight = (float(x) for x in out.stdout.split())
    return rtt, one, eight


def make_files(work: pathlib.Path, size_mb: int, variables: int) -> dict[str, pathlib.Path]:
    """The local checkpoints (cached in ``work``): name -> path."""
    import numpy as np  # noqa: PLC0415

    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, pathlib.Path] = {}
    for tag, seed in (("a", 0), ("b", 1)):
        prefix = _common.generate_flat_bundle(work / f"tf_{size_mb}mb_{variables}v_{tag}" / "ckpt", size_mb, variables, seed)
        out[f"tf_{tag}"] = pathlib.Path(prefix)
    per = max(1, size_mb * 2**20 // variables // 4)
    for tag, seed in (("a", 0), ("b", 1)):
        path = work / f"st_{size_mb}mb_{variables}v_{tag}.safetensors"
        if not path.exists():
            from safetensors.numpy import save_file  # noqa: PLC0415

            rng = np.random.default_rng(seed)
            save_file({f"layer_{i:04d}": rng.standard_normal(per, dtype=np.float32) for i in range(variables)}, str(path))
        out[f"st_{tag}"] = path
    h5 = work / f"h5_{size_mb}mb_{variables}v.weights.h5"
    if not h5.exists():
        import h5py  # noqa: PLC0415

        rng = np.random.default_rng(2)
        with h5py.File(h5, "w") as f:
            for i in range(variables):
                f.create_dataset(f"layers/dense_{i}/vars/0", data=rng.standard_normal(per, dtype=np.float32))
    out["h5"] = h5
    npz = work / f"npz_{size_mb}mb_{variables}v.npz"
    if not npz.exists():
        rng = np.random.default_rng(3)
        np.savez(npz, **{f"layer_{i:04d}": rng.standard_normal(per, dtype=np.float32) for i in range(variables)})
    out["npz"] = npz
    pt = work / f"pt_{size_mb}mb_{variables}v.pt"
    if not pt.exists():
        code = (f"import torch; g = torch.Generator().manual_seed(4); torch.save({{f'layer_{{i:04d}}': torch.randn({per}, generator=g)"
                f" for i in range({variables})}}, {str(pt)!r})")
        if subprocess.run([sys.executable, "-c", code]).returncode != 0:
            pt = None  # type: ignore[assignment]
    if pt is not None:
        out["pt"] = pt
    return out


def measure_http(work: pathlib.Path, size_mb: int, variables: int, rounds: int, latency_ms: float, mbps: float = 0.0,
                 log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Every http pair timed (median of ``rounds``), its requests counted (one more run each),
    and the link profiled. Returns {"pairs": {id: {label: {"seconds", "requests", "times"}}},
    "link": {...}, "titles": {id: title}}."""
    sources = http_sources(work, size_mb, variables)
    root = link_tree(work / "remote_http", sources)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out: dict[str, Any] = {"pairs": {}, "titles": {}, "latency_ms": latency_ms, "mbps_per_connection": mbps}
    with http_store(root, latency_ms, mbps) as proxy:
        base = proxy.endpoint + "/"
        for pid, (_cmd, title, tools) in http_pairs(base, sources).items():
            out["titles"][pid] = title.replace("LATENCY", f"{latency_ms:g}")
            res: dict[str, Any] = {label: {"times": []} for label, *_ in tools}
            for r in range(rounds + 1):  # the first run counts requests (and warms the page cache), untimed
                for label, argv, _ours, ok in (tools if r % 2 == 0 else list(reversed(tools))):
                    proxy.reset()
                    start = time.perf_counter()
                    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
                    elapsed = time.perf_counter() - start
                    if proc.returncode not in ok:
                        raise RuntimeError(f"{pid}: {label}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
                    if r == 0:
                        res[label]["requests"] = proxy.requests
                        res[label]["bytes"] = proxy.bytes_out
                    else:
                        res[label]["times"].append(elapsed)
            for v in res.values():
                v["seconds"] = statistics.median(v["times"])
            out["pairs"][pid] = res
            log(f"{pid}: " + ", ".join(f"{k} {v['seconds']:.2f} s, {v['requests']} requests" for k, v in res.items()))
        big = next((k for k in ("tf_a/ckpt.data-00000-of-00001", "st_a.safetensors") if k in sources), None)
        if big is not None:
            rtt, one, eight = link_profile(base + big, sources[big].stat().st_size, env)
            out["link"] = {"rtt_s": rtt, "one_stream_bytes_s": one, "eight_streams_bytes_s": eight}
            log(f"link: {rtt * 1000:.1f} ms a request, one stream {one / 2**20:.0f} MiB/s, eight {eight / 2**20:.0f} MiB/s")
    return out


def diff_bound(link: dict[str, float], size: int, latency_s: float) -> float:
    """The most any reader can gain over one plain read per file, from the link alone: two files
    of ``size`` bytes read one after the other in one request each (a round trip and the bytes at
    one stream's rate) against the same bytes at eight streams' rate, round trips overlapped."""
    plain = 2 * (latency_s + size / link["one_stream_bytes_s"])
    best = 2 * size / link["eight_streams_bytes_s"] + latency_s
    return plain / best


def main_http(args: argparse.Namespace) -> int:
    work = pathlib.Path(args.work)
    got = measure_http(work, args.size_mb, args.variables, args.rounds, args.latency_ms, args.mbps_per_connection)
    print(f"object store: HTTP range server on 127.0.0.1 behind a proxy holding each request {args.latency_ms:g} ms"
          + (f", {args.mbps_per_connection:g} MB/s per connection" if args.mbps_per_connection else "")
          + f"; {args.rounds} rounds (median); {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print("| pair | tool | seconds | requests | MiB moved |")
    print("|---|---|---|---|---|")
    for pid, res in got["pairs"].items():
        for label, v in res.items():
            print(f"| {pid} | {label} | {v['seconds']:.2f} | {v['requests']} | {v['bytes'] / 2**20:.0f} |")
    link = got.get("link")
    if link:
        print(f"\nlink: {link['rtt_s'] * 1000:.1f} ms a request; one stream {link['one_stream_bytes_s'] / 2**20:.0f} MiB/s,"
              f" eight {link['eight_streams_bytes_s'] / 2**20:.0f} MiB/s")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", choices=("http", "moto"), default="http")
    ap.add_argument("--size-mb", type=int, default=None, help="http: the work folder's set (1024); moto: files written here (256)")
    ap.add_argument("--variables", type=int, default=None, help="http: 2000; moto: 200")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--mbps-per-connection", type=float, default=0.0,
                    help="cap each connection's answers at this many MB/s, as a store's single stream (default: no cap)")
    ap.add_argument("--work", default=str(_common.DEFAULT_WORK if hasattr(_common, "DEFAULT_WORK") else HERE / "_work"))
    args = ap.parse_args()
    if args.store == "http":
        args.size_mb, args.variables = args.size_mb or 1024, args.variables or 2000
        return main_http(args)
    args.size_mb, args.variables = args.size_mb or 256, args.variables or 200
    from object_store import DUMMY_ENV, Proxy, moto_server, upload_tree  # noqa: PLC0415

    files = make_files(pathlib.Path(args.work) / "remote", args.size_mb, args.variables)
    with moto_server() as endpoint:
        urls: dict[str, str] = {}
        for name, path in files.items():
            if name.startswith("tf_"):
                for f in sorted(path.parent.iterdir()):
                    if f.name.startswith(path.name + "."):
                        upload_tree(endpoint, f, f"bench/{name}/{f.name}")
                urls[name] = f"s3://bench/{name}/{path.name}"
            else:
                upload_tree(endpoint, path, f"bench/{path.name}")
                urls[name] = f"s3://bench/{path.name}"
        proxy = Proxy(endpoint, delay=args.latency_ms / 1000, bandwidth=args.mbps_per_connection * 1e6)
        env = {**os.environ, **DUMMY_ENV, "AWS_ENDPOINT_URL": proxy.endpoint, "PYTHONPATH": str(ROOT),
               "TF_CPP_MIN_LOG_LEVEL": "3"}

        def timed(cmd: list[str]) -> tuple[float, int]:
            proxy.reset()
            start = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            elapsed = time.perf_counter() - start
            if proc.returncode not in (0, 1):
                raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
            return elapsed, proxy.requests

        ck = [sys.executable, "-m", "ckptinspect"]
        rows = []
        for name in ("tf_a", "st_a", "h5", "npz", "pt"):
            if name not in urls:
                continue
            runs = [timed([*ck, "ls", urls[name]]) for _ in range(args.rounds)]
            t = statistics.median(r[0] for r in runs)
            n = max(r[1] for r in runs)
            target = f"<= {TARGET_LS_REQUESTS}" if name in ("tf_a", "st_a") else ""
            ok = ("yes" if n <= TARGET_LS_REQUESTS else "NO") if target else ""
            rows.append(["ls", name, f"{t:.2f}", str(n), target, ok])
        size = {k: sum(f.stat().st_size for f in p.parent.iterdir() if f.name.startswith(p.name + "."))
                if k.startswith("tf_") else p.stat().st_size for k, p in files.items()}
        for kind in ("tf", "st"):
            a, b = urls[f"{kind}_a"], urls[f"{kind}_b"]
            ours = [timed([*ck, "diff", a, b, "-q"]) for _ in range(args.rounds)]
            if kind == "tf":
                pairs = [f"{a}.data-00000-of-00001|{b}.data-00000-of-00001"]
            else:
                pairs = [f"{a}|{b}"]
            plain = [timed([sys.executable, "-c", PLAIN_READ, "s3", *pairs]) for _ in range(args.rounds)]
            t_ours, t_plain = statistics.median(r[0] for r in ours), statistics.median(r[0] for r in plain)
            ratio = t_plain / t_ours
            rows.append(["diff", f"{kind} ({size[kind + '_a'] / 2**20:.0f} MiB x2)", f"{t_ours:.2f}",
                         str(max(r[1] for r in ours)), f"fsspec open().read(): {t_plain:.2f} s, {max(r[1] for r in plain)} req",
                         f"{ratio:.2f}x ({'yes' if ratio >= TARGET_DIFF_RATIO else 'NO'}, target >= {TARGET_DIFF_RATIO:g}x)"])
        proxy.close()
    cap = f", answers capped at {args.mbps_per_connection:g} MB/s per connection" if args.mbps_per_connection else ""
    print(f"object store: moto server on 127.0.0.1, {args.latency_ms:g} ms per request{cap}; files of about {args.size_mb} MB,"
          f" {args.variables} variables; {args.rounds} rounds (median); {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print("| command | checkpoint | seconds | requests | against | target met |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
