"""Benchmark: re-writing a TF bundle with the native writer (byte copies) vs TensorFlow's SaveV2 route.

The source is the shared generator's ``bundle`` layout (``_common.layout_for(SIZE, VARIABLES)``:
a Keras 3 Dense chain with its Adam state, about SIZE MiB in VARIABLES entries). Each route is
one child process, timed whole (wall seconds and peak RSS from ``os.wait4``) and, inside, for
the write alone:

* ``native``: ``formats.write_bundle_native`` of every variable copied with ``copy_tensor``
  (``copy_file_range``, checksums reused) in storage order, plus the object graph, fsync'ed
  (these processes never import TensorFlow);
* ``native-nofsync``: the same without fsync (what TensorFlow's writer does);
* ``native-checked``: the same with ``check_copies=True`` (bytes read through, crc32c compared);
* ``native-stream``: every tensor decoded and re-encoded instead of copied (``iter_blocks`` of
  1 Mi elements into ``TensorData.from_blocks``, crc32c computed), fsync'ed: the path of
  tensors that change (cast, average);
* ``savev2``: ``formats.tf_writer.write_bundle`` (SaveV2 groups + MergeV2Checkpoints) of every
  variable read with ``restore_tensor`` (RestoreV2), as ``extract`` writes today;
* ``baseline``: a process that imports ckptinspect and TensorFlow and writes nothing (the
  floor of the SaveV2 route).

Not part of ``benchmarks/run.py`` yet.

    python benchmarks/bench_bundle_writer.py [--size-mb 1024] [--variables 2000] [--rounds 3] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _common

CHILD = r'''
import json, os, sys, time
route, src, out = sys.argv[1:4]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import ckptinspect
from ckptinspect import formats
if not route.startswith("native"):
    from ckptinspect._tf import import_tf
    tf = import_tf()
start = time.perf_counter()
if route == "native-stream":
    with ckptinspect.open(src) as ckpt:
        tensors = [formats.OutputTensor(v.key, v.dtype, v.shape, formats.TensorData.from_blocks(
                       v.dtype, v.shape, lambda v=v: ckpt.iter_blocks(v, 1 << 20)))
                   for v in sorted(ckpt.variables, key=ckpt.storage_order)]
        s = formats.write_bundle_native(out, tensors, object_graph=ckpt.source.object_graph())
    shards = s.num_shards
elif route.startswith("native"):
    with ckptinspect.open(src) as ckpt:
        tensors = [formats.copy_tensor(ckpt, v) for v in sorted(ckpt.variables, key=ckpt.storage_order)]
        s = formats.write_bundle_native(out, tensors, object_graph=ckpt.source.object_graph(),
                                        fsync=route != "native-nofsync", check_copies=route == "native-checked")
    shards = s.num_shards
elif route == "savev2":
    from ckptinspect.formats.tf.index import OBJECT_GRAPH_KEY
    with ckptinspect.open(src) as ckpt:
        tensors = [formats.BundleTensor(v.key, (lambda v=v: formats.restore_tensor(src, v.key, v.dtype)), v.nbytes)
                   for v in ckpt.variables]
        tensors.append(formats.object_graph_tensor(ckpt.source.object_graph()))
        shards = formats.write_bundle(out, tensors)
else:
    shards = 0
print(json.dumps({"write_seconds": time.perf_counter() - start, "shards": shards}), file=sys.stderr)
'''

ROUTES = ("baseline", "native", "native-nofsync", "native-checked", "native-stream", "savev2")


def run_route(route: str, src: str, out: pathlib.Path, env: dict[str, str]) -> dict:
    _common.remove(out)
    cmd = [sys.executable, "-c", CHILD, route, src, str(out)]
    import subprocess
    import time

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{route} failed:\n{err.decode(errors='replace')[-3000:]}")
    inner = json.loads(err.decode().strip().splitlines()[-1])
    return {"wall": wall, "peak": usage.ru_maxrss * 1024, **inner}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--variables", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=pathlib.Path, default=_common.DEFAULT_WORK)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()

    layout = _common.layout_for(args.size_mb, args.variables)
    sets = _common.ensure_checkpoints([(layout, ["bundle"])], args.work, log=lambda m: print(m, file=sys.stderr))
    src = sets[layout.name].a
    env = {**os.environ, **_common.CHILD_ENV, "PYTHONPATH": str(_common.ROOT)}
    out = args.work / "writer_out" / "ckpt"
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {r: [] for r in ROUTES}
    for _ in range(args.rounds):
        for route in ROUTES:
            results[route].append(run_route(route, src, out, env))
    _common.remove(out)
    rows = {}
    for route, runs in results.items():
        rows[route] = {
            "write_seconds": statistics.median(r["write_seconds"] for r in runs),
            "wall_seconds": statistics.median(r["wall"] for r in runs),
            "peak_mib": max(r["peak"] for r in runs) / 2**20,
            "shards": runs[0]["shards"],
        }
    size = sum(f.stat().st_size for f in pathlib.Path(src).parent.glob(pathlib.Path(src).name + ".*"))
    print(f"source: {src} ({size / 2**20:.0f} MiB, {layout.variables} entries requested); median of {args.rounds}")
    print(f"{'route':16} {'write s':>8} {'process s':>10} {'peak MiB':>9} {'shards':>7}")
    for route, row in rows.items():
        print(f"{route:16} {row['write_seconds']:8.2f} {row['wall_seconds']:10.2f} {row['peak_mib']:9.0f} {row['shards']:7d}")
    if args.json:
        args.json.write_text(json.dumps({"source": src, "bytes": size, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
