"""Benchmark: checkpoints on object storage (issue 29), against a real S3-compatible server.

Starts moto's S3 server on 127.0.0.1 (a subprocess) behind a TCP proxy that holds each request
``--latency-ms`` (default 20 ms: a store's round trip) and counts requests; uploads a TF bundle,
a safetensors file, a Keras .h5, an .npz and a torch .pt of about ``--size-mb`` MB each (two of
the TF bundle and the safetensors file, for ``diff``); then times, as whole processes:

* ``ckptinspect ls`` of each format: wall time and requests (targets: at most 3 requests for a
  safetensors file and for a TF bundle's index);
* ``ckptinspect diff`` of two remote TF bundles and of two remote safetensors files, against
  fsspec's plain ``open().read()`` of both (the data files for TF) and a byte comparison
  (target: ckptinspect at least 3x faster). ``tf.io.gfile`` has no ``s3://`` file system in
  TensorFlow 2.16+ (it moved to tensorflow-io), so it is not timed.

    python benchmarks/bench_remote.py [--size-mb 256] [--variables 200] [--rounds 3] [--latency-ms 20]

Needs moto's server, s3fs, safetensors, h5py (the test extra). Prints a Markdown table.

Caveat, measured: moto's server copies the whole object for every GET, ranged or not (its
``FakeKey.value``): a 64 KiB range of a 256 MB object takes 180 ms there against 30 ms for a 32 MB
one. Request counts are what this run measures well; times of many ranged requests on large
objects (HDF5 and npz listings, ``diff``) are dominated by that copy and say little about a real
store, where a ranged GET costs its round trip and its bytes.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
import _common  # noqa: E402 - the shared timing helpers beside this script

TARGET_LS_REQUESTS = 3
TARGET_DIFF_RATIO = 3.0

PLAIN_READ = """
import sys, fsspec, numpy as np
fs = fsspec.filesystem("s3")
pairs = [p.split("|") for p in sys.argv[1:]]
for a, b in pairs:
    x = fs.open(a, "rb").read()
    y = fs.open(b, "rb").read()
    n = min(len(x), len(y)) // 4 * 4
    d = np.frombuffer(x[:n], np.uint8) != np.frombuffer(y[:n], np.uint8)
    print(a, int(d.sum()))
"""


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--variables", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--mbps-per-connection", type=float, default=0.0,
                    help="cap each connection's answers at this many MB/s, as a store's single stream (default: no cap)")
    ap.add_argument("--work", default=str(_common.DEFAULT_WORK if hasattr(_common, "DEFAULT_WORK") else HERE / "_work"))
    args = ap.parse_args()
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
            plain = [timed([sys.executable, "-c", PLAIN_READ, *pairs]) for _ in range(args.rounds)]
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
