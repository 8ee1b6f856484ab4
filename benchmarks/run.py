"""Benchmarks: every ckptinspect command timed side by side with what users would run instead.

    python benchmarks/run.py [--size-mb 1024] [--variables 2000] [--rounds 3]
                             [--only ls,diff,...] [--scale 100,1024,4096] [--work DIR]

Generates synthetic checkpoints once into the work folder (see ``_common.py``: a Keras 3 Dense
chain with its Adam state as a TF bundle, single-shard and multi-shard, as legacy ``.h5`` and
``.weights.h5``, and a perturbed copy), then times each pair as whole processes (the ckptinspect
command and its alternatives alternating, the order reversed every round, after untimed warm-up
runs that leave the page cache warm), and records the median wall time, the spread (max - min)
and the peak RSS of each tool (``ru_maxrss`` from ``os.wait4``, taken by a bare launcher process so
that it is the tool's own, floor ~9 MiB: see ``_common.run_timed``). A scale series times ``ls``,
``ls --stats``, ``diff`` (TF bundles and .h5), ``verify``, ``scan``, ``average`` and ``extract`` (and
their TensorFlow or read-once counterparts) against checkpoint size and plots it
to ``benchmarks/scale.png`` (needs matplotlib: ``pip install -e .[bench]``). The object storage rows
(``ls-remote-*``, ``diff-remote-*``; issue 29) read the same files over http ranged GETs from a range
server on 127.0.0.1 behind a proxy holding each request 20 ms, which counts the requests
(``bench_remote.py``).

Writes ``benchmarks/RESULTS.md`` (and ``results.json`` in the work folder). Hand-written notes
between ``<!-- notes:start -->`` and ``<!-- notes:end -->`` in an existing RESULTS.md are kept.
A pair whose ckptinspect command does not exist yet is reported as not available; rows that need
``h5ls``/``h5diff`` (Debian: ``apt-get install hdf5-tools``) are skipped, saying so, when those
are missing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fnmatch
import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any, Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _common as c  # noqa: E402
import bench_torch  # noqa: E402 - the .safetensors / .pt pairs (issue 15)
import bench_many  # noqa: E402 - many small objects, scan's quarters run, giant headers (issue 28)
import bench_orbax  # noqa: E402 - the Orbax pairs (issue 24)
import bench_remote  # noqa: E402 - the object storage pairs (issue 29)

RESULTS = c.HERE / "RESULTS.md"
PLOT = c.HERE / "scale.png"
RATIO_PLOT = c.HERE / "ratios.png"
NOTES_START = "<!-- notes:start -->"
NOTES_END = "<!-- notes:end -->"
FLOOR_MB = 4  # the small checkpoint whose diff peak is the "baseline" of diff's memory target
MIB = 2**20
PY = sys.executable
CKPT = [PY, "-m", "ckptinspect"]
HDF5_TOOLS_HINT = "not installed (Debian: apt-get install hdf5-tools)"
# The scale series: series id -> the ckptinspect command it needs.
SCALE_SERIES = {"ls": "ls", "ls-stats": "ls", "diff": "diff", "diff-h5": "diff", "verify": "verify",
                "scan": "scan", "average": "average", "extract": "extract"}
SCALE_COMMANDS = tuple(SCALE_SERIES)
# Pairs whose ckptinspect command imports TensorFlow (builds a Keras model or writes through TF).
TF_IMPORTING = ("extract", "extract-weights-h5", "transplant", "transplant-weights-h5")
MEMORY_LIMIT_MIB = 150  # issue 16: no command over this on the 1 GB files, except those importing TF
OTHER_FILES = ("-kw3-", "-giant-", "-quarters")  # issue 28's pairs on other files (their own targets)
FILE_LABELS = {
    "a": "A: TF bundle, single shard (`a/ckpt`)",
    "b": "B: A perturbed, TF bundle (`b/ckpt`)",
    "c": "C: B perturbed again, TF bundle (`c/ckpt`; average)",
    "sharded": "A: TF bundle, multi-shard (`sharded/ckpt`)",
    "model.h5": "A: legacy Keras `model.h5`",
    "model_b.h5": "B: legacy Keras `model_b.h5`",
    "model.weights.h5": "A: Keras 3 `model.weights.h5`",
}

# -- the alternatives, as scripts a user would write ----------------------------------------
TF_LIST = "import tensorflow as tf\nprint(len(tf.train.list_variables({p!r})))\n"
# issue 26: one tensor's value, from a fresh process (start-up included): our decoder vs TF's reader.
READ_OURS = "import ckptinspect\nwith ckptinspect.open({p!r}) as c:\n    print(c.read({k!r}).shape)\n"
READ_TF = "import tensorflow as tf\nprint(tf.train.load_checkpoint({p!r}).get_tensor({k!r}).shape)\n"
READ_TARGET_S = 0.3  # read() of one tensor of the 1 GB checkpoint, start-up included (issue 26)
TF_STATS = """import numpy as np, tensorflow as tf
r = tf.train.load_checkpoint({p!r})
for key in sorted(r.get_variable_to_shape_map()):
    a = r.get_tensor(key)
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "fiu":
        continue
    nan = inf = 0
    f = a
    if a.dtype.kind == "f":
        nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
        if nan or inf:
            f = a[np.isfinite(a)]
    if f.size:
        print(key, f.min(), f.max(), f.mean(dtype=np.float64), f.std(dtype=np.float64), nan, inf)
"""
TF_DIFF = """import numpy as np, tensorflow as tf
ra, rb = tf.train.load_checkpoint({a!r}), tf.train.load_checkpoint({b!r})
sa, sb = ra.get_variable_to_shape_map(), rb.get_variable_to_shape_map()
changed = 0
for key in sorted(sa.keys() & sb.keys()):
    if key == "_CHECKPOINTABLE_OBJECT_GRAPH":
        continue
    x, y = ra.get_tensor(key), rb.get_tensor(key)
    if x.shape != y.shape:
        print(key, "shape", x.shape, y.shape)
        continue
    d = float(np.max(np.abs(x - y))) if x.size else 0.0
    changed += d > 0
    print(key, d)
print("added", len(sb.keys() - sa.keys()), "removed", len(sa.keys() - sb.keys()), "changed", changed)
"""
TF_READ_ALL = """import tensorflow as tf
r = tf.train.load_checkpoint({p!r})
n = 0
for key in r.get_variable_to_shape_map():
    r.get_tensor(key)
    n += 1
print(n, "tensors read")
"""
# Reading each checkpoint of the run once: TensorFlow's reader hands every tensor to numpy.
TF_READ_RUN = """import glob, os, tensorflow as tf
n = 0
for index in sorted(glob.glob(os.path.join({p!r}, "ckpt-*.index"))):
    r = tf.train.load_checkpoint(index[:-len(".index")])
    for key in r.get_variable_to_shape_map():
        r.get_tensor(key)
        n += 1
print(n, "tensors read")
"""
TF_EXTRACT = """import tensorflow as tf, bench_model
model, optimizer = bench_model.build_with_optimizer()
tf.train.Checkpoint(model=model, optimizer=optimizer).restore({src!r}).expect_partial()
tf.train.Checkpoint(model=model).write({out!r})
"""
KERAS_EXTRACT = """import tensorflow as tf, bench_model
model, optimizer = bench_model.build_with_optimizer()
tf.train.Checkpoint(model=model, optimizer=optimizer).restore({src!r}).expect_partial()
model.save_weights({out!r})
"""
TF_TRANSPLANT = """import tensorflow as tf, bench_model
model = bench_model.build()
tf.train.Checkpoint(model=model).restore({src!r}).expect_partial()
tf.train.Checkpoint(model=model).write({out!r})
"""
KERAS_TRANSPLANT = """import bench_model
model = bench_model.build()
model.load_weights({src!r})
model.save_weights({out!r})
"""
# Renaming every variable by hand: read each tensor, make a variable of it, write a new
# checkpoint (TF2 object-based: a module tracking the variables by their new names).
TF_RENAME = """import tensorflow as tf
r = tf.train.load_checkpoint({src!r})
root = tf.Module()
root.vars = {{}}
for key in r.get_variable_to_shape_map():
    if key != "_CHECKPOINTABLE_OBJECT_GRAPH":
        root.vars["r/" + key] = tf.Variable(r.get_tensor(key))
tf.train.Checkpoint(root=root).write({out!r})
"""
KERAS_EDITOR = "import keras\nkeras.saving.KerasFileEditor({p!r}).summary()\n"
# The floor of any h5py-based tool: open the file(s), visit every object, (read every dataset).
H5PY_VISIT = """import h5py
out = []
with h5py.File({p!r}, "r") as f:
    f.visititems(lambda n, o: out.append((n, getattr(o, "shape", None), getattr(o, "dtype", None))))
print(len(out))
"""
H5PY_DIFF = """import h5py, numpy as np
with h5py.File({a!r}, "r") as fa, h5py.File({b!r}, "r") as fb:
    names = []
    fa.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    changed = 0
    for n in names:
        x, y = fa[n][()], fb[n][()]
        d = float(np.max(np.abs(x - y))) if x.size else 0.0
        changed += d > 0
        print(n, d)
print("changed", changed)
"""

# The safetensors library's own header-only listing (keys, shapes, dtypes).
SAFE_OPEN_KEYS = """from safetensors import safe_open
with safe_open({p!r}, framework="np") as f:
    rows = [(k, f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()]
print(len(rows))
"""

# Reading three checkpoints once, every tensor through numpy (the bytes each data file holds,
# viewed as the entry's dtype; what an averaging script must read at the least).
TF_READ_THREE = """import tensorflow as tf
n = 0
for p in {paths!r}:
    r = tf.train.load_checkpoint(p)
    for key in r.get_variable_to_shape_map():
        r.get_tensor(key)
        n += 1
print(n, "tensors read")
"""
# The manual route (tensor2tensor's avg_checkpoints, in TF 2): every value of the three read
# through TF, averaged with numpy in float64, written by SaveV2 under the same keys.
TF_AVERAGE = """import os, numpy as np, tensorflow as tf
paths = {paths!r}
os.makedirs(os.path.dirname({out!r}), exist_ok=True)
readers = [tf.train.load_checkpoint(p) for p in paths]
dtypes = readers[-1].get_variable_to_dtype_map()
keys, values = [], []
for key, dtype in sorted(dtypes.items()):
    if dtype.is_floating:
        value = np.mean(np.stack([r.get_tensor(key) for r in readers]).astype(np.float64), axis=0)
        value = tf.constant(value.astype(dtype.as_numpy_dtype))
    else:
        value = tf.constant(readers[-1].get_tensor(key), dtype=dtype)
    keys.append(key)
    values.append(value)
tf.raw_ops.SaveV2(prefix={out!r}, tensor_names=keys, shape_and_slices=[""] * len(keys), tensors=values)
"""


def cat_prefixes(paths: list[str]) -> list[str]:
    """``cat`` every file of the given TF prefixes to /dev/null: reading them once, the floor."""
    return ["sh", "-c", 'for p in "$@"; do cat "$p".index "$p".data-*; done > /dev/null', "sh", *paths]


def read_write_floor(paths: list[str], out: str, direct: bool) -> list[str]:
    """The I/O floor of a job that reads the given TF prefixes once and writes one checkpoint of
    the last one's size durably: ``cat`` them to /dev/null, then ``dd`` the last one's data files
    to ``out`` with ``conv=fsync`` (through the page cache, or with ``oflag=direct`` around it,
    as ``average`` writes)."""
    flags = "conv=fsync oflag=direct" if direct else "conv=fsync"
    script = ('out="$1"; shift; for p in "$@"; do cat "$p".index "$p".data-*; done > /dev/null && mkdir -p "$(dirname "$out")"'
              ' && for p in "$@"; do last="$p"; done && for f in "$last".data-*; do'
              f' dd if="$f" of="$out" bs=8M {flags} status=none || exit 1; rm -f "$out"; done')
    return ["sh", "-c", script, "sh", out, *paths]


# The floor of diff on TF bundles: the index parsed by ckptinspect (no TF import), then both
# checkpoints' bytes read in 1 MiB blocks into reused buffers, and the same comparison in numpy,
# single-threaded: equal bytes -> finite check; else float64 max |a - b| and the sums behind
# rel_l2 and cosine.
NUMPY_DIFF_FLOOR = """import os, numpy as np
from ckptinspect.formats.tf.index import read_index
from ckptinspect.formats._layout import data_path
BLOCK = 1 << 20
def entries(p):
    ix = read_index(p)
    return ix.num_shards, {{e.key: e for e in ix.entries if e.dtype == "float32" and not e.slices}}
(na, ea), (nb, eb) = entries({a!r}), entries({b!r})
fds, bufs = {{}}, [bytearray(BLOCK), bytearray(BLOCK)]
def fd(p):
    if p not in fds:
        fds[p] = os.open(p, os.O_RDONLY)
    return fds[p]
changed = 0
for key in sorted(ea.keys() & eb.keys()):
    x_e, y_e = ea[key], eb[key]
    fa, fb = fd(data_path({a!r}, x_e.shard_id, na)), fd(data_path({b!r}, y_e.shard_id, nb))
    mx = dd = xx = yy = xy = 0.0
    for off in range(0, x_e.size, BLOCK):
        n = min(BLOCK, x_e.size - off)
        va, vb = memoryview(bufs[0])[:n], memoryview(bufs[1])[:n]
        os.preadv(fa, [va], x_e.offset + off)
        os.preadv(fb, [vb], y_e.offset + off)
        x, y = np.frombuffer(va, np.float32), np.frombuffer(vb, np.float32)
        if np.array_equal(x.view(np.uint32), y.view(np.uint32)):
            assert np.isfinite(x.min()) and np.isfinite(x.max())
            continue
        x, y = x.astype(np.float64), y.astype(np.float64)
        d = x - y
        mx = max(mx, float(np.abs(d).max()))
        dd += float(np.square(d).sum()); xx += float(np.square(x).sum()); yy += float(np.square(y).sum()); xy += float((x * y).sum())
    changed += mx > 0
print("changed", changed)
"""


NUMPY_FLOOR_LABEL = "numpy floor (raw bytes + numpy, 1 thread)"

# The floor of any Python tool that compares two files: the interpreter started, numpy imported
# (on one BLAS thread, as ckptinspect runs), both files read whole in 1 MiB blocks, nothing
# compared. Many small datasets (issue 28) are measured beside it: what is left above it is the
# listing and the comparison.
PYTHON_READ_FLOOR = """import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy
buf = memoryview(bytearray(1 << 20))
for p in {paths!r}:
    fd, off = os.open(p, os.O_RDONLY), 0
    while n := os.preadv(fd, [buf], off):
        off += n
    os.close(fd)
"""
PYTHON_READ_FLOOR_LABEL = "Python floor (start, import numpy, read both files)"


def py(code: str) -> list[str]:
    return [PY, "-c", code]


@dataclasses.dataclass
class Pair:
    """A ckptinspect command and what users would run instead, on the same input.

    Attributes:
        id: Short name (what ``--only`` matches).
        command: The ckptinspect command it needs.
        title: What is timed.
        tools: The ckptinspect tool first, then the alternatives.
        rounds: Timed runs per tool at most, when fewer than ``--rounds`` (giant headers: one).
        warmup: Untimed runs per tool at most, when fewer than ``--warmup`` (cold-cache pairs: none).
    """

    id: str
    command: str
    title: str
    tools: list[c.Tool]
    rounds: int | None = None
    warmup: int | None = None


@functools.lru_cache(maxsize=None)
def largest_key(prefix: str) -> str:
    """The key of a bundle's largest tensor (from its index, in a child: no import here); a
    placeholder before the checkpoints are generated (the pairs are made again after)."""
    if not os.path.exists(prefix + ".index"):
        return "?"
    code = ("import ckptinspect\nwith ckptinspect.open(%r) as c:\n"
            "    print(max(c.variables, key=lambda v: (v.nbytes, v.key)).key)\n" % prefix)
    return subprocess.run(py(code), capture_output=True, text=True, check=True).stdout.strip()


def make_pairs(s: c.CheckpointSet, out: pathlib.Path) -> list[Pair]:
    """Every pair on the checkpoint set ``s``; outputs of writing commands go under ``out``."""
    h5ls = None if shutil.which("h5ls") else f"h5ls {HDF5_TOOLS_HINT}"
    h5diff = None if shutil.which("h5diff") else f"h5diff {HDF5_TOOLS_HINT}"
    # TF outputs are prefixes in their own folder (removed before each run); Keras ones are files.
    o = {k: str(out / k / "ckpt") for k in ("extract_ours", "extract_tf", "transplant_ours", "transplant_tf",
                                            "rewrite_ours", "rewrite_tf")}
    o |= {k: str(out / f"{k}.weights.h5") for k in ("extract_wh5_ours", "extract_wh5_keras", "transplant_wh5_ours", "transplant_wh5_keras")}
    o |= {k: str(out / k / "ckpt") for k in ("average_ours", "average_tf", "average_floor", "average_floor_direct")}
    three = [s.a, s.b, s.c]  # one run: A, B (A perturbed), C (B perturbed again)
    ours = dict(ours=True)
    return [
        Pair("ls", "ls", "list a TF bundle (single shard)", [
            c.Tool("ckptinspect ls", [*CKPT, "ls", s.a], **ours),
            c.Tool("tf.train.list_variables", py(TF_LIST.format(p=s.a))),
            c.Tool("inspect_checkpoint", [PY, "-m", "tensorflow.python.tools.inspect_checkpoint", f"--file_name={s.a}"]),
        ]),
        Pair("read", "ls", "read() of the largest tensor, in a fresh process (issue 26)", [
            c.Tool("ckptinspect.open(p).read(name)", py(READ_OURS.format(p=s.a, k=largest_key(s.a))), **ours),
            c.Tool("tf.train.load_checkpoint(p).get_tensor(key)", py(READ_TF.format(p=s.a, k=largest_key(s.a)))),
        ]),
        Pair("ls-sharded", "ls", "list a multi-shard TF bundle (MaxShardSizePolicy)", [
            c.Tool("ckptinspect ls", [*CKPT, "ls", s.sharded], **ours),
            c.Tool("tf.train.list_variables", py(TF_LIST.format(p=s.sharded))),
        ]),
        Pair("ls-h5", "ls", "list the legacy Keras .h5 (model.save: weights + optimizer)", [
            c.Tool("ckptinspect ls", [*CKPT, "ls", s.h5_a], **ours),
            c.Tool("h5ls -r", ["h5ls", "-r", s.h5_a], missing=h5ls),
            c.Tool("h5py visititems (floor of an h5py lister)", py(H5PY_VISIT.format(p=s.h5_a))),
        ]),
        Pair("ls-weights-h5", "ls", "list the Keras 3 .weights.h5 (save_weights of the compiled model: weights + optimizer)", [
            c.Tool("ckptinspect ls", [*CKPT, "ls", s.weights_h5], **ours),
            c.Tool("h5ls -r", ["h5ls", "-r", s.weights_h5], missing=h5ls),
            c.Tool("h5py visititems (floor of an h5py lister)", py(H5PY_VISIT.format(p=s.weights_h5))),
            c.Tool("KerasFileEditor.summary()", py(KERAS_EDITOR.format(p=s.weights_h5))),
        ]),
        Pair("ls-stats", "ls", "per-tensor min/max/mean/std/NaN/Inf of every tensor", [
            c.Tool("ckptinspect ls --stats", [*CKPT, "ls", s.a, "--stats"], **ours),
            c.Tool("TF script (load_checkpoint + numpy)", py(TF_STATS.format(p=s.a))),
        ]),
        Pair("diff", "diff", "compare A with B (TF bundles, every 4th tensor changed)", [
            c.Tool("ckptinspect diff", [*CKPT, "diff", s.a, s.b], ok_codes=(1,), **ours),
            c.Tool("TF script (max abs diff per key)", py(TF_DIFF.format(a=s.a, b=s.b))),
            c.Tool(NUMPY_FLOOR_LABEL, py(NUMPY_DIFF_FLOOR.format(a=s.a, b=s.b))),
        ]),
        Pair("diff-h5", "diff", "compare A with B (legacy .h5 files)", [
            c.Tool("ckptinspect diff", [*CKPT, "diff", s.h5_a, s.h5_b], ok_codes=(1,), **ours),
            c.Tool("h5diff -d 0.01", ["h5diff", "-d", "0.01", s.h5_a, s.h5_b], ok_codes=(0, 1), missing=h5diff),
            c.Tool("h5py script (max abs diff per dataset)", py(H5PY_DIFF.format(a=s.h5_a, b=s.h5_b))),
        ]),
        Pair("extract", "extract", "model weights only, optimizer stripped, to a TF bundle", [
            c.Tool("ckptinspect extract", [*CKPT, "extract", s.a, "-o", o["extract_ours"]], cleanup=(str(out / "extract_ours"),), **ours),
            c.Tool("rebuild + restore + Checkpoint(model).write", py(TF_EXTRACT.format(src=s.a, out=o["extract_tf"])), cleanup=(str(out / "extract_tf"),)),
        ]),
        Pair("extract-weights-h5", "extract", "model weights only, to a Keras 3 .weights.h5", [
            c.Tool("ckptinspect extract --builder", [*CKPT, "extract", s.a, "-o", o["extract_wh5_ours"], "--builder", c.BUILDER_SPEC], cleanup=(o["extract_wh5_ours"],), **ours),
            c.Tool("rebuild + restore + save_weights", py(KERAS_EXTRACT.format(src=s.a, out=o["extract_wh5_keras"])), cleanup=(o["extract_wh5_keras"],)),
        ]),
        Pair("rewrite", "rewrite", "rename every variable, to a TF bundle", [
            c.Tool("ckptinspect rewrite --rename", [*CKPT, "rewrite", s.a, "-o", o["rewrite_ours"], "--rename", r"^(.*)$=r/\1"],
                   cleanup=(str(out / "rewrite_ours"),), **ours),
            c.Tool("load_checkpoint + tf.Variable + Checkpoint.write", py(TF_RENAME.format(src=s.a, out=o["rewrite_tf"])),
                   cleanup=(str(out / "rewrite_tf"),)),
        ]),
        Pair("transplant", "transplant", "TF bundle into a freshly built model, written as a TF bundle", [
            c.Tool("ckptinspect transplant", [*CKPT, "transplant", s.a, o["transplant_ours"], "--builder", c.BUILDER_SPEC], cleanup=(str(out / "transplant_ours"),), **ours),
            c.Tool("Checkpoint(model).restore + write", py(TF_TRANSPLANT.format(src=s.a, out=o["transplant_tf"])), cleanup=(str(out / "transplant_tf"),)),
        ]),
        Pair("transplant-weights-h5", "transplant", ".weights.h5 into a freshly built model, written as .weights.h5", [
            c.Tool("ckptinspect transplant", [*CKPT, "transplant", s.weights_h5, o["transplant_wh5_ours"], "--builder", c.BUILDER_SPEC], cleanup=(o["transplant_wh5_ours"],), **ours),
            c.Tool("load_weights + save_weights", py(KERAS_TRANSPLANT.format(src=s.weights_h5, out=o["transplant_wh5_keras"])), cleanup=(o["transplant_wh5_keras"],)),
        ]),
        Pair("average", "average", "mean of three checkpoints of one run (A, B, C) vs reading them once", [
            c.Tool("ckptinspect average", [*CKPT, "average", *three, "-o", o["average_ours"]], cleanup=(str(out / "average_ours"),), **ours),
            c.Tool("cat the three to /dev/null (reading once)", cat_prefixes(three)),
            c.Tool("I/O floor: cat the three + dd one checkpoint, conv=fsync", read_write_floor(three, o["average_floor"], False),
                   cleanup=(str(out / "average_floor"),)),
            c.Tool("I/O floor: cat the three + dd one checkpoint, oflag=direct conv=fsync",
                   read_write_floor(three, o["average_floor_direct"], True), cleanup=(str(out / "average_floor_direct"),)),
            c.Tool("TF: get_tensor of every key of the three", py(TF_READ_THREE.format(paths=three))),
            c.Tool("TF script: load_checkpoint x3 + np.mean + SaveV2", py(TF_AVERAGE.format(paths=three, out=o["average_tf"])), cleanup=(str(out / "average_tf"),)),
        ]),
        Pair("verify", "verify", "check every tensor's checksum (single shard)", [
            c.Tool("ckptinspect verify", [*CKPT, "verify", s.a], **ours),
            c.Tool("TF: get_tensor of every key", py(TF_READ_ALL.format(p=s.a))),
        ]),
        Pair("verify-sharded", "verify", "check every tensor's checksum (multi-shard)", [
            c.Tool("ckptinspect verify", [*CKPT, "verify", s.sharded], **ours),
            c.Tool("TF: get_tensor of every key", py(TF_READ_ALL.format(p=s.sharded))),
        ]),
        *torch_pairs(s, out),
        *many_pairs(out.parent, h5ls, h5diff),
        *cold_pairs(s),
        *orbax_pairs(out),
        *remote_pairs(s, out.parent),
        Pair("scan", "scan", f"a {c.RUN_CHECKPOINTS}-checkpoint run (a, b, a, b, a): per-tensor norms, changes, NaN/Inf, drift, health", [
            c.Tool("ckptinspect scan", [*CKPT, "scan", s.run], **ours),
            c.Tool("read each checkpoint once: TF get_tensor of every key", py(TF_READ_RUN.format(p=s.run))),
            c.Tool("read each checkpoint once: ckptinspect verify DIR", [*CKPT, "verify", s.run]),
        ]),
    ]


def many_pairs(work: pathlib.Path, h5ls: str | None, h5diff: str | None) -> list[Pair]:
    """Issue 28's pairs on files with many small objects (``bench_many``): Keras 3 ``.weights.h5``
    files of 100, 2,000 and 20,000 datasets at one total size (a per-dataset cost shows as a slope),
    scan of a run whose steps change different quarters, and giant headers (a ``.safetensors`` of
    1.3 million tensors, a TF index of 100,000 variables)."""
    pairs = []
    for n in bench_many.COUNTS:
        a, b = bench_many.many_h5_paths(work, n)
        size = f"{n:,} datasets x {bench_many.TOTAL_MB * 1024 // n:,} KB"
        pairs += [
            Pair(f"ls-kw3-{n}", "ls", f"list a Keras 3 .weights.h5 of {size} (layers/<name>/vars/<i>)", [
                c.Tool("ckptinspect ls", [*CKPT, "ls", a], ours=True),
                c.Tool("h5ls -r", ["h5ls", "-r", a], missing=h5ls),
                c.Tool("h5py visititems (floor of an h5py lister)", py(H5PY_VISIT.format(p=a))),
            ]),
            Pair(f"diff-kw3-{n}", "diff", f"compare two Keras 3 .weights.h5 of {size} (every 4th dataset changed)", [
                c.Tool("ckptinspect diff", [*CKPT, "diff", a, b], ok_codes=(1,), ours=True),
                c.Tool("h5diff -d 0.01", ["h5diff", "-d", "0.01", a, b], ok_codes=(0, 1), missing=h5diff),
                c.Tool(PYTHON_READ_FLOOR_LABEL, py(PYTHON_READ_FLOOR.format(paths=[a, b]))),
            ]),
        ]
    run = bench_many.quarters_path(work)
    pairs.append(Pair("scan-quarters", "scan", f"a {bench_many.RUN_STEPS}-checkpoint run of {bench_many.TOTAL_MB} MB each whose steps "
                      "change different quarters of the tensors", [
        c.Tool("ckptinspect scan", [*CKPT, "scan", run], ours=True),
        c.Tool("read each checkpoint once: ckptinspect verify DIR", [*CKPT, "verify", run]),
        c.Tool("read each checkpoint once: TF get_tensor of every key", py(TF_READ_RUN.format(p=run))),
    ]))
    st, tf = bench_many.giant_safetensors_path(work), bench_many.giant_tf_path(work)
    small = {"safetensors": bench_many.giant_safetensors_path(work, bench_many.BASELINE_ENTRIES),
             "tf": bench_many.giant_tf_path(work, bench_many.BASELINE_ENTRIES)}
    tf_same_path = bench_many.giant_tf_path(work, bench_many.TF_SAME_PATH_VARIABLES)
    torch_missing = _torch_missing()
    once = dict(rounds=1, warmup=0)  # minutes per run: one timed run each
    n_st, n_tf = f"{bench_many.SAFETENSORS_TENSORS:,}", f"{bench_many.TF_INDEX_VARIABLES:,}"

    def giant(cmd: str, fmt: str, path: str, title: str, *peers: c.Tool) -> Pair:
        """A giant-file pair: ckptinspect, the peers, and the memory baseline (the same command
        on a small file of the same generator; not an alternative: its label starts with ckptinspect)."""
        def files(p: str) -> list[str]:
            return [p, p] if cmd == "diff" else [p]

        same_path = ([c.Tool(giant_same_path_label(cmd), [*CKPT, cmd, *files(tf_same_path)])]
                     if fmt == "tf" else [])
        return Pair(f"{cmd}-giant-{fmt}", cmd, title, [
            c.Tool(f"ckptinspect {cmd}", [*CKPT, cmd, *files(path)], ours=True), *peers,
            c.Tool(giant_baseline_label(cmd), [*CKPT, cmd, *files(small[fmt])]), *same_path,
        ], **once)

    pairs += [
        giant("ls", "safetensors", st, f"list a .safetensors of {n_st} tensors (a 96 MB header)",
              c.Tool("safe_open keys (script)", py(SAFE_OPEN_KEYS.format(p=st)), missing=torch_missing)),
        giant("verify", "safetensors", st, f"verify a .safetensors of {n_st} tensors"),
        giant("diff", "safetensors", st, f"diff X X of a .safetensors of {n_st} tensors"),
        giant("ls", "tf", tf, f"list a TF bundle of {n_tf} variables", c.Tool("tf.train.list_variables", py(TF_LIST.format(p=tf)))),
        giant("verify", "tf", tf, f"verify a TF bundle of {n_tf} variables",
              c.Tool("TF: get_tensor of every key", py(TF_READ_ALL.format(p=tf)))),
        giant("diff", "tf", tf, f"diff X X of a TF bundle of {n_tf} variables"),
    ]
    return pairs


def giant_baseline_label(cmd: str) -> str:
    """The label of a giant pair's memory baseline."""
    return f"ckptinspect {cmd} of a {bench_many.BASELINE_ENTRIES}-entry file (memory baseline)"


def giant_same_path_label(cmd: str) -> str:
    """The label of the giant TF pair's smaller file on the same code path (its memory slope)."""
    return f"ckptinspect {cmd} of a {bench_many.TF_SAME_PATH_VARIABLES:,}-variable file (same path, memory slope)"


def cold_pairs(s: c.CheckpointSet) -> list[Pair]:
    """ls, diff, verify and scan of the 1 GB files with a cold page cache (the inputs' pages
    dropped with ``posix_fadvise(DONTNEED)`` before each run), beside TF's route likewise."""
    def cold(*inputs: str) -> dict[str, Any]:
        return {"cold": tuple(inputs)}

    none = dict(warmup=0)  # each run starts cold: nothing to warm

    return [
        Pair("ls-cold", "ls", "list a TF bundle, cold page cache", [
            c.Tool("ckptinspect ls", [*CKPT, "ls", s.a], ours=True, **cold(s.a)),
            c.Tool("tf.train.list_variables", py(TF_LIST.format(p=s.a)), **cold(s.a)),
        ], **none),
        Pair("diff-cold", "diff", "compare A with B (TF bundles), cold page cache", [
            c.Tool("ckptinspect diff", [*CKPT, "diff", s.a, s.b], ok_codes=(1,), ours=True, **cold(s.a, s.b)),
            c.Tool("TF script (max abs diff per key)", py(TF_DIFF.format(a=s.a, b=s.b)), **cold(s.a, s.b)),
            c.Tool("cat A and B to /dev/null (reading once)", cat_prefixes([s.a, s.b]), **cold(s.a, s.b)),
        ], **none),
        Pair("verify-cold", "verify", "check every tensor's checksum, cold page cache", [
            c.Tool("ckptinspect verify", [*CKPT, "verify", s.a], ours=True, **cold(s.a)),
            c.Tool("TF: get_tensor of every key", py(TF_READ_ALL.format(p=s.a)), **cold(s.a)),
            c.Tool("cat A to /dev/null (reading once)", cat_prefixes([s.a]), **cold(s.a)),
        ], **none),
        Pair("scan-cold", "scan", f"a {c.RUN_CHECKPOINTS}-checkpoint run (a, b, a, b, a), cold page cache", [
            c.Tool("ckptinspect scan", [*CKPT, "scan", s.run], ours=True, **cold(s.run)),
            c.Tool("read each checkpoint once: TF get_tensor of every key", py(TF_READ_RUN.format(p=s.run)), **cold(s.run)),
            c.Tool("read each checkpoint once: ckptinspect verify DIR", [*CKPT, "verify", s.run], **cold(s.run)),
        ], **none),
    ]


TORCH_TITLES = {
    "ls-safetensors": "list a .safetensors file (the same float32 tensors, written by safetensors.torch.save_file)",
    "ls-pt": "list a torch.save .pt file (the same tensors; torch.load reads every byte)",
}


@functools.lru_cache(maxsize=None)
def _torch_missing() -> str | None:
    return None if bench_torch.torch_available() else bench_torch.TORCH_MISSING


def torch_pairs(s: c.CheckpointSet, out: pathlib.Path) -> list[Pair]:
    """``ls`` of a .safetensors and a .pt file of about the main size (skipped without torch)."""
    st, pt = bench_torch.paths(out.parent, s.layout.size_mb, s.layout.variables)
    groups = bench_torch.tools(st, pt, _torch_missing())
    return [Pair(pid, "ls", TORCH_TITLES[pid], tools) for pid, tools in groups.items()]


# -- the Orbax pairs (issue 24): two 1 GB steps written by orbax itself, its metadata API and
# restore beside ckptinspect; skipped, saying why, without $CKPTINSPECT_ORBAX_PYTHON ------------
def orbax_pairs(out: pathlib.Path) -> list[Pair]:
    """``ls`` and ``diff`` of Orbax steps (under the work folder, ``orbax_1gb/``)."""
    groups = bench_orbax.tools(out.parent, c.Tool, bench_orbax.orbax_python())
    return [Pair(pid, pid.split("-")[0], bench_orbax.TITLES[pid], tools) for pid, tools in groups.items()]


# -- object storage (issue 29): the 1 GB files over http ranged GETs (a range server on 127.0.0.1
# behind a proxy holding each request REMOTE_LATENCY_MS and counting requests) --------------------
REMOTE_LATENCY_MS = 20.0
REMOTE_REQUESTS: dict[str, dict[str, int]] = {}  # pair id -> tool -> requests of one untimed run
REMOTE_LINK: dict[str, float] = {}  # bench_remote.link_profile's measures of the link


@functools.lru_cache(maxsize=None)
def _remote_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _remote_sources(s: c.CheckpointSet, work: pathlib.Path) -> dict[str, pathlib.Path]:
    return bench_remote.http_sources(work, s.layout.size_mb, s.layout.variables)


def remote_pairs(s: c.CheckpointSet, work: pathlib.Path) -> list[Pair]:
    """``ls`` of each format and ``diff`` of two TF bundles / safetensors files over http
    (``bench_remote.http_pairs``); a pair whose files are not in the work folder is skipped, saying so."""
    sources = _remote_sources(s, work)
    base = f"http://127.0.0.1:{_remote_port()}/"
    pairs = []
    for pid, (command, title, tools) in bench_remote.http_pairs(base, sources, every=True).items():
        names = {u[len(base):] for _, argv, _, _ in tools for a in argv for u in a.split("|") if u.startswith(base)}
        missing = sorted(n for n in names if not any(k.startswith(n) for k in sources))
        why = (f"not in the work folder: {', '.join(missing)} (run.py's set, bench_torch's files, bench_remote.py --store moto's"
               " .h5/.npz)") if missing else None
        pairs.append(Pair(pid, command, title.replace("LATENCY", f"{REMOTE_LATENCY_MS:g}"),
                          [c.Tool(label, argv, ok_codes=ok, ours=ours, missing=why) for label, argv, ours, ok in tools]))
    return pairs


def count_remote_requests(pair: Pair, proxy: Any, env: dict[str, str], cwd: str) -> None:
    """One more (untimed) run of each tool of a remote pair, its requests counted by the proxy."""
    for tool in pair.tools:
        if tool.missing is not None:
            continue
        proxy.reset()
        try:
            c.run_timed(tool.cmd, env=env, cwd=cwd, ok_codes=tool.ok_codes)
        except c.ToolFailed:
            continue
        REMOTE_REQUESTS.setdefault(pair.id, {})[tool.label] = proxy.requests


def remote_targets(results: dict[str, dict[str, Any]], size_mb: int) -> list[list[str]]:
    """Issue 29's targets: requests of ls over http, diff against fsspec's plain read of both files."""
    rows: list[list[str]] = []

    def add(target: str, measured: str | None, ok: bool | None) -> None:
        rows.append(_verdict(target, measured, ok))

    for kind in ("tf", "safetensors", "pt", "h5", "npz"):
        pid = f"ls-remote-{kind}"
        n = REMOTE_REQUESTS.get(pid, {}).get("ckptinspect ls")
        m = med(results, pid, "ckptinspect ls")
        measured = f"{n} requests, {m.median:.2f} s" if n is not None and m else None
        if kind in bench_remote.LS_REQUEST_TARGETS:
            most = bench_remote.LS_REQUEST_TARGETS[kind]
            add(f"ls of a {size_mb} MB {kind} checkpoint over http in at most {most} requests ({REMOTE_LATENCY_MS:g} ms each; issue 29)",
                measured, n <= most if n is not None else None)
        else:
            add(f"(context) ls of a {kind} checkpoint over http ({REMOTE_LATENCY_MS:g} ms a request): requests and time", measured, None)
    plain = "fsspec open().read() of both + numpy compare"
    for kind in ("tf", "safetensors"):
        pid = f"diff-remote-{kind}"
        d, p = med(results, pid, "ckptinspect diff"), med(results, pid, plain)
        req = REMOTE_REQUESTS.get(pid, {})
        add(f"diff of two {size_mb} MB {kind} checkpoints over http >= {bench_remote.TARGET_DIFF_RATIO:g}x faster than fsspec's plain"
            f" open().read() of both ({REMOTE_LATENCY_MS:g} ms a request; issue 29)",
            f"{p.median / d.median:.2f}x ({d.median:.2f} s, {req.get('ckptinspect diff', '?')} requests vs {p.median:.2f} s,"
            f" {req.get(plain, '?')} requests)" if d and p else None,
            p.median >= bench_remote.TARGET_DIFF_RATIO * d.median if d and p else None)
    if REMOTE_LINK:
        bound = bench_remote.diff_bound(REMOTE_LINK, size_mb << 20, REMOTE_LATENCY_MS / 1000)
        add("(context) the link (proxy + range server on 127.0.0.1): a request's round trip; one stream's and eight streams' rate;"
            " the most parallel ranges can gain over one plain read per file from the link alone",
            f"{REMOTE_LINK['rtt_s'] * 1000:.1f} ms; {REMOTE_LINK['one_stream_bytes_s'] / MIB:.0f} MiB/s vs"
            f" {REMOTE_LINK['eight_streams_bytes_s'] / MIB:.0f} MiB/s; {bound:.2f}x", None)
    return rows


def scale_tools(s: c.CheckpointSet, baselines: bool, out: pathlib.Path) -> dict[str, list[c.Tool]]:
    """The scale series' tools per series id: ckptinspect, then (optionally) its peer.

    The commands that stream tensors into an output or across a run (``scan``, ``average``,
    ``extract``) are timed against the cheapest route that reads the same bytes once (our
    ``verify``, ``cat``); their TF routes hold whole checkpoints in memory and are timed on the
    main set only.
    """
    h5diff = None if shutil.which("h5diff") else f"h5diff {HDF5_TOOLS_HINT}"
    three = [s.a, s.b, s.c]
    series_tools = {
        "ls": [c.Tool("ckptinspect ls", [*CKPT, "ls", s.a], ours=True), c.Tool("tf.train.list_variables", py(TF_LIST.format(p=s.a)))],
        "ls-stats": [c.Tool("ckptinspect ls --stats", [*CKPT, "ls", s.a, "--stats"], ours=True),
                     c.Tool("TF script (load_checkpoint + numpy)", py(TF_STATS.format(p=s.a)))],
        "diff": [c.Tool("ckptinspect diff", [*CKPT, "diff", s.a, s.b], ok_codes=(1,), ours=True), c.Tool("TF script (max abs diff per key)", py(TF_DIFF.format(a=s.a, b=s.b)))],
        "diff-h5": [c.Tool("ckptinspect diff", [*CKPT, "diff", s.h5_a, s.h5_b], ok_codes=(1,), ours=True),
                    c.Tool("h5diff -d 0.01", ["h5diff", "-d", "0.01", s.h5_a, s.h5_b], ok_codes=(0, 1), missing=h5diff)],
        "verify": [c.Tool("ckptinspect verify", [*CKPT, "verify", s.a], ours=True), c.Tool("TF: get_tensor of every key", py(TF_READ_ALL.format(p=s.a)))],
        "scan": [c.Tool("ckptinspect scan", [*CKPT, "scan", s.run], ours=True),
                 c.Tool("read each checkpoint once: ckptinspect verify DIR", [*CKPT, "verify", s.run])],
        "average": [c.Tool("ckptinspect average", [*CKPT, "average", *three, "-o", str(out / "scale_average" / "ckpt")],
                           cleanup=(str(out / "scale_average"),), ours=True),
                    c.Tool("cat the three to /dev/null (reading once)", cat_prefixes(three))],
        "extract": [c.Tool("ckptinspect extract", [*CKPT, "extract", s.a, "-o", str(out / "scale_extract" / "ckpt")],
                           cleanup=(str(out / "scale_extract"),), ours=True),
                    c.Tool("cat A to /dev/null (reading once)", cat_prefixes([s.a]))],
    }
    kinds = set(s.meta.get("kinds", ()))
    for series, need in (("diff-h5", "h5"), ("average", "third")):
        if need not in kinds:
            series_tools.pop(series)
    if not os.path.isfile(os.path.join(s.run, "checkpoint")):
        series_tools.pop("scan")
    return {k: v if baselines else v[:1] for k, v in series_tools.items()}


CHECK_CHILD = """import json, subprocess, sys
proc = subprocess.run(sys.argv[3:], capture_output=True, text=True)
if proc.returncode not in json.loads(sys.argv[1]):
    print(json.dumps(f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"))
    sys.exit()
try:
    d = json.loads(proc.stdout)
    print(json.dumps(eval(sys.argv[2])))
except (ValueError, KeyError, TypeError) as exc:
    print(json.dumps(f"unreadable output ({exc})"))
"""


def sanity_checks(s: c.CheckpointSet, pair_ids: set[str], commands: set[str], work: pathlib.Path) -> list[list[str]]:
    """Untimed checks that the timed commands do the job on these files (ckptinspect's JSON output).

    Returns:
        ``[what, expected, got, verdict]`` rows.
    """
    meta, rows = s.meta, []
    n, changed = meta["entries"], meta["perturbed"]
    checks = [
        ("ls", "ls", f"ls {s.a} --format json: variables", [s.a], (0,), 'len(d["variables"])', n),
        ("ls-sharded", "ls", "ls sharded --format json: variables", [s.sharded], (0,), 'len(d["variables"])', n),
        ("ls-h5", "ls", "ls model.h5 --format json: variables", [s.h5_a], (0,), 'len(d["variables"])', n),
        ("ls-weights-h5", "ls", "ls model.weights.h5 --format json: variables", [s.weights_h5], (0,), 'len(d["variables"])', n),
        ("diff", "diff", "diff A B --format json: changed", [s.a, s.b], (1,), 'd["summary"]["changed"]', changed),
        ("diff-h5", "diff", "diff model.h5 model_b.h5 --format json: changed", [s.h5_a, s.h5_b], (1,), 'd["summary"]["changed"]', changed),
        ("verify", "verify", "verify A --format json: intact", [s.a], (0,), 'd["intact"]', True),
        ("verify-sharded", "verify", "verify sharded --format json: intact", [s.sharded], (0,), 'd["intact"]', True),
        ("scan", "scan", "scan run --format json: checkpoints scanned", [s.run], (0,), 'len(d["steps"])', c.RUN_CHECKPOINTS),
        ("scan-quarters", "scan", "scan quarters run --format json: checkpoints scanned", [bench_many.quarters_path(work)], (0,),
         'len(d["steps"])', bench_many.RUN_STEPS),
    ]
    for n in bench_many.COUNTS:
        a, b = bench_many.many_h5_paths(work, n)
        checks += [(f"ls-kw3-{n}", "ls", f"ls kw3-{n} A --format json: variables", [a], (0,), 'len(d["variables"])', n),
                   (f"diff-kw3-{n}", "diff", f"diff kw3-{n} A B --format json: changed", [a, b], (1,),
                    'd["summary"]["changed"]', -(-n // bench_many.PERTURB_EVERY))]
    for pair_id, cmd, what, paths, codes, get, expected in checks:
        if pair_id not in pair_ids or cmd not in commands:
            continue
        # The JSON is read by a child: the output of a 20,000-variable diff would grow this
        # process, and a child's ru_maxrss starts at its parent's size (exec keeps the larger).
        proc = subprocess.run([PY, "-c", CHECK_CHILD, json.dumps(list(codes)), get, *CKPT, cmd, *paths, "--format", "json"],
                              capture_output=True, text=True, env=s.env())
        try:
            got = json.loads(proc.stdout)
        except ValueError:
            got = f"check failed: {proc.stderr.strip()[-200:]}"
        rows.append([what.replace(s.a, "A"), str(expected), str(got), "ok" if got == expected else "**wrong**"])
    return rows


def cli_commands() -> set[str]:
    """The commands ``ckptinspect`` has, from its click group (in a child: no import here)."""
    code = "import ckptinspect.cli as m\nprint(' '.join(m.app.commands))"
    proc = subprocess.run(py(code), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"cannot list ckptinspect's commands:\n{proc.stderr[-2000:]}")
    return set(proc.stdout.split())


def select(pairs: list[Pair], only: str | None) -> list[Pair]:
    """The pairs ``--only`` names: comma-separated pair ids or shell patterns (``ls*``); all when None.

    Raises:
        ValueError: A name or pattern matches no pair.
    """
    if not only:
        return pairs
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = [w for w in wanted if not any(fnmatch.fnmatchcase(p.id, w) for p in pairs)]
    if unknown:
        raise ValueError(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(p.id for p in pairs)} (or patterns such as ls*)")
    return [p for p in pairs if any(fnmatch.fnmatchcase(p.id, w) for w in wanted)]


# -- formatting ---------------------------------------------------------------------------
def mib(n: float) -> str:
    return f"{n / MIB:.1f}"


def table(headers: list[str], rows: list[list[Any]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(headers) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def pair_rows(pair: Pair, res: dict[str, Any]) -> list[list[Any]]:
    ours = next(t for t in pair.tools if t.ours)
    base = res.get(ours.label)
    rows = []
    for t in pair.tools:
        m = res.get(t.label)
        if t.missing:
            rows.append([t.label, "skipped", "", "", t.missing])
        elif isinstance(m, str) or m is None:
            rows.append([t.label, "failed", "", "", (m or "not run").splitlines()[0][:120]])
        else:
            ratio = ""
            if isinstance(base, c.Measurement):
                ratio = "1.00x (reference)" if t.ours else f"{m.median / base.median:.2f}x"
            rows.append([t.label, f"{m.median:.3f}", f"{m.spread:.3f}", mib(m.peak), ratio])
    return rows


def read_notes(path: pathlib.Path) -> str:
    if path.is_file():
        text = path.read_text()
        i, j = text.find(NOTES_START), text.find(NOTES_END)
        if 0 <= i < j:
            return text[i:j + len(NOTES_END)]
    return f"{NOTES_START}\n(none yet)\n{NOTES_END}"


# -- targets ------------------------------------------------------------------------------
def med(results: dict[str, dict[str, Any]], pair: str, label: str) -> c.Measurement | None:
    m = results.get(pair, {}).get(label)
    return m if isinstance(m, c.Measurement) else None


def evaluate_targets(results: dict[str, dict[str, Any]], s: c.CheckpointSet, floor_peak: int | None, scale: list[dict[str, Any]]) -> list[list[str]]:
    """The targets of issues 8, 14, 15, 16, 24, 26, 28 and 29, each as ``[target, measured, verdict]``."""
    rows: list[list[str]] = []

    def add(target: str, measured: str | None, ok: bool | None) -> None:
        rows.append(_verdict(target, measured, ok))

    ls, lv = med(results, "ls", "ckptinspect ls"), med(results, "ls", "tf.train.list_variables")
    add(f"ls >= 10x faster than tf.train.list_variables ({s.meta['entries']} variables)",
        f"{lv.median / ls.median:.1f}x ({ls.median:.3f} s vs {lv.median:.3f} s)" if ls and lv else None,
        lv.median / ls.median >= 10 if ls and lv else None)
    r, g = med(results, "read", "ckptinspect.open(p).read(name)"), med(results, "read", "tf.train.load_checkpoint(p).get_tensor(key)")
    add(f"read() of one tensor under {READ_TARGET_S} s, start-up included ({s.layout.size_mb} MB; issue 26)",
        f"{r.median:.3f} s ({mib(r.peak)} MiB) vs get_tensor {g.median:.3f} s ({mib(g.peak)} MiB)" if r and g else
        (f"{r.median:.3f} s" if r else None), r.median < READ_TARGET_S if r else None)
    peaks = [(p, med(results, p, "ckptinspect ls")) for p in ("ls", "ls-sharded", "ls-h5", "ls-weights-h5")]
    peaks = [(p, m) for p, m in peaks if m]
    add("ls peak memory < 100 MiB",
        ", ".join(f"{p}: {mib(m.peak)} MiB" for p, m in peaks) if peaks else None,
        all(m.peak < 100 * MIB for _, m in peaks) if peaks else None)
    for p in ("ls-h5", "ls-weights-h5"):
        a, b = med(results, p, "ckptinspect ls"), med(results, p, "h5ls -r")
        add(f"ls within 2x of h5ls -r ({p})",
            f"{a.median / b.median:.2f}x h5ls's time ({a.median:.3f} s vs {b.median:.3f} s)" if a and b else None,
            a.median <= 2 * b.median if a and b else None)
    d, t = med(results, "diff", "ckptinspect diff"), med(results, "diff", "TF script (max abs diff per key)")
    add("diff no slower than the TF script",
        f"{t.median / d.median:.2f}x faster ({d.median:.3f} s vs {t.median:.3f} s)" if d and t else None,
        d.median <= t.median if d and t else None)
    d, h = med(results, "diff-h5", "ckptinspect diff"), med(results, "diff-h5", "h5diff -d 0.01")
    add("diff >= 1.5x faster than h5diff -d 0.01 (legacy .h5 pair; issue 16)",
        f"{h.median / d.median:.2f}x ({d.median:.3f} s vs {h.median:.3f} s)" if d and h else None,
        h.median >= 1.5 * d.median if d and h else None)
    d, t = med(results, "diff", "ckptinspect diff"), med(results, "diff", "TF script (max abs diff per key)")
    add("diff >= 5x faster than the TF script (issue 16)",
        f"{t.median / d.median:.2f}x ({d.median:.3f} s vs {t.median:.3f} s)" if d and t else None,
        t.median >= 5 * d.median if d and t else None)
    f = med(results, "diff", NUMPY_FLOOR_LABEL)
    add("diff within 1.3x of the numpy floor (issue 16)",
        f"{d.median / f.median:.2f}x the floor's time ({d.median:.3f} s vs {f.median:.3f} s)" if d and f else None,
        d.median <= 1.3 * f.median if d and f else None)
    a, v = med(results, "ls-h5", "ckptinspect ls"), med(results, "ls-h5", "h5py visititems (floor of an h5py lister)")
    add("ls of a Keras HDF5 file within 1.2x of h5py visititems (issue 16)",
        f"{a.median / v.median:.2f}x ({a.median:.3f} s vs {v.median:.3f} s)" if a and v else None,
        a.median <= 1.2 * v.median if a and v else None)
    a, t = med(results, "ls-stats", "ckptinspect ls --stats"), med(results, "ls-stats", "TF script (load_checkpoint + numpy)")
    add("ls --stats >= 4x faster than the TF script (issue 16)",
        f"{t.median / a.median:.2f}x ({a.median:.3f} s vs {t.median:.3f} s)" if a and t else None,
        t.median >= 4 * a.median if a and t else None)
    main_files = {p: r for p, r in results.items() if p not in TF_IMPORTING and not any(w in p for w in OTHER_FILES)}
    over = [f"{p}: {mib(m.peak)} MiB" for p, r in main_files.items() for k, m in r.items()
            if isinstance(m, c.Measurement) and k.startswith("ckptinspect") and m.peak > MEMORY_LIMIT_MIB * MIB]
    ours = [m for p, r in main_files.items() for k, m in r.items() if isinstance(m, c.Measurement) and k.startswith("ckptinspect")]
    add(f"no ckptinspect command over {MEMORY_LIMIT_MIB} MiB on the 1 GB files, except those importing TF (issue 16)",
        ("over: " + ", ".join(over)) if over else (f"largest {mib(max(m.peak for m in ours))} MiB" if ours else None),
        not over if ours else None)
    largest = s.meta["largest_tensor_bytes"]
    d = med(results, "diff", "ckptinspect diff")
    if d and floor_peak:
        limit = floor_peak + 3 * largest
        add(f"diff peak <= baseline + 3x largest tensor ({s.layout.size_mb} MB)",
            f"{mib(d.peak)} MiB vs limit {mib(limit)} MiB ({mib(floor_peak)} + 3 x {mib(largest)})", d.peak <= limit)
    else:
        add("diff peak <= baseline + 3x largest tensor", None, None)
    for point in scale:
        m = point["results"].get("diff", {}).get("ckptinspect diff")
        if isinstance(m, c.Measurement) and floor_peak and point["size_mb"] != s.layout.size_mb:
            limit = floor_peak + 3 * point["largest_tensor_bytes"]
            add(f"diff peak <= baseline + 3x largest tensor ({point['size_mb']} MB, scale series)",
                f"{mib(m.peak)} MiB vs limit {mib(limit)} MiB", m.peak <= limit)
    e, t = med(results, "extract", "ckptinspect extract"), med(results, "extract", "rebuild + restore + Checkpoint(model).write")
    add(f"extract >= 10x faster than rebuild + restore + Checkpoint(model).write ({s.layout.size_mb} MB, issue 14)",
        f"{t.median / e.median:.1f}x ({e.median:.3f} s vs {t.median:.3f} s)" if e and t else None,
        t.median >= 10 * e.median if e and t else None)
    add("extract peak memory < 150 MiB (issue 14)", f"{mib(e.peak)} MiB" if e else None, e.peak < 150 * MIB if e else None)
    for p in ("verify", "verify-sharded"):
        v, t = med(results, p, "ckptinspect verify"), med(results, p, "TF: get_tensor of every key")
        add(f"verify at least as fast as reading every tensor through TF ({p})",
            f"{t.median / v.median:.2f}x ({v.median:.3f} s vs {t.median:.3f} s)" if v and t else None,
            v.median <= t.median if v and t else None)
    a, b = med(results, "ls-safetensors", "ckptinspect ls"), med(results, "ls-safetensors", "safe_open keys (script)")
    add(f"ls of a {s.layout.size_mb} MB .safetensors no slower than a safe_open key-listing script (issue 15)",
        f"{a.median / b.median:.2f}x the script's time ({a.median:.3f} s vs {b.median:.3f} s)" if a and b else None,
        a.median <= b.median if a and b else None)
    a, b = med(results, "ls-pt", "ckptinspect ls"), med(results, "ls-pt", "torch.load(weights_only=True)")
    add(f"ls of a {s.layout.size_mb} MB .pt >= 10x faster than torch.load(weights_only=True) (issue 15)",
        f"{b.median / a.median:.1f}x ({a.median:.3f} s vs {b.median:.3f} s)" if a and b else None,
        b.median >= 10 * a.median if a and b else None)
    a, r = med(results, "average", "ckptinspect average"), med(results, "average", "cat the three to /dev/null (reading once)")
    floors = [f for f in (med(results, "average", "I/O floor: cat the three + dd one checkpoint, conv=fsync"),
                          med(results, "average", "I/O floor: cat the three + dd one checkpoint, oflag=direct conv=fsync")) if f]
    f = min(floors, key=lambda t: t.median) if floors else None
    add("average of three checkpoints within 2x of the job's I/O floor: read the three once, write one checkpoint durably"
        " (the faster dd row; issue 28)",
        f"{a.median / f.median:.2f}x ({a.median:.3f} s vs {f.median:.3f} s), peak {mib(a.peak)} MiB" if a and f else None,
        a.median <= 2 * f.median if a and f else None)
    add("(context) average vs reading the three once (cat)",
        f"{a.median / r.median:.2f}x ({a.median:.3f} s vs {r.median:.3f} s)" if a and r else None, None)
    rows += many_targets(results)
    rows += orbax_targets(results)
    rows += remote_targets(results, s.layout.size_mb)
    return rows


def many_targets(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Issue 28's targets on the files with many small objects, giant headers, and the cold rows."""
    rows: list[list[str]] = []

    def add(target: str, measured: str | None, ok: bool | None) -> None:
        rows.append(_verdict(target, measured, ok))

    main = 2000
    d, h = med(results, f"diff-kw3-{main}", "ckptinspect diff"), med(results, f"diff-kw3-{main}", "h5diff -d 0.01")
    add(f"diff >= 1.5x faster than h5diff -d 0.01 (Keras 3 .weights.h5, {main:,} datasets x 100 KB; issue 28)",
        f"{h.median / d.median:.2f}x ({d.median:.3f} s vs {h.median:.3f} s)" if d and h else None,
        h.median >= 1.5 * d.median if d and h else None)
    f = med(results, f"diff-kw3-{main}", PYTHON_READ_FLOOR_LABEL)
    add("(context) that diff's budget (h5diff's time / 1.5) against the Python floor (start, import numpy, read both "
        "files, nothing compared)",
        f"budget {h.median / 1.5:.3f} s, floor {f.median:.3f} s ({f.median / (h.median / 1.5):.0%} of it), "
        f"ckptinspect {d.median - f.median:.3f} s above the floor" if d and h and f else None, None)
    a, b = med(results, f"ls-kw3-{main}", "ckptinspect ls"), med(results, f"ls-kw3-{main}", "h5ls -r")
    add(f"ls within 2x of h5ls -r (Keras 3 .weights.h5, {main:,} datasets; issue 28)",
        f"{a.median / b.median:.2f}x h5ls's time ({a.median:.3f} s vs {b.median:.3f} s)" if a and b else None,
        a.median <= 2 * b.median if a and b else None)
    lo, hi = bench_many.COUNTS[0], bench_many.COUNTS[-1]
    for kind, peer in (("ls", "h5ls -r"), ("diff", "h5diff -d 0.01")):
        slopes = []
        for label in (f"ckptinspect {kind}", peer):
            x, y = med(results, f"{kind}-kw3-{lo}", label), med(results, f"{kind}-kw3-{hi}", label)
            if x and y:
                slopes.append(f"{label} {(y.median - x.median) / (hi - lo) * 1e6:.0f} us")
        add(f"(context) {kind}: cost per dataset, (t({hi:,}) - t({lo:,})) / {hi - lo:,} at the same total size",
            ", ".join(slopes) if slopes else None, None)
    sc, v = med(results, "scan-quarters", "ckptinspect scan"), med(results, "scan-quarters", "read each checkpoint once: ckptinspect verify DIR")
    add("scan within 1.5x of verify DIR (a run whose steps change different quarters; issue 28)",
        f"{sc.median / v.median:.2f}x ({sc.median:.3f} s vs {v.median:.3f} s)" if sc and v else None,
        sc.median <= 1.5 * v.median if sc and v else None)
    for fmt, what, size in (("safetensors", "the header", _giant_header_bytes), ("tf", "the index", _giant_index_bytes)):
        for cmd in ("ls", "verify", "diff"):
            pid = f"{cmd}-giant-{fmt}"
            m = med(results, pid, f"ckptinspect {cmd}")
            if cmd == "ls":
                add(f"ls of the giant {fmt} file under 5 s (issue 28)", f"{m.median:.2f} s" if m else None, m.median < 5 if m else None)
            base = med(results, pid, giant_baseline_label(cmd))
            if fmt == "tf":
                add(*_giant_memory_slope(cmd, m, med(results, pid, giant_same_path_label(cmd)), _tf_index_bytes))
                target, measured, _ = _giant_memory(cmd, fmt, what, m, base, size())
                add(f"(context) {target}", measured, None)
            else:
                add(*_giant_memory(cmd, fmt, what, m, base, size()))
    for pid, ours, peer in (("ls-cold", "ckptinspect ls", "tf.train.list_variables"),
                            ("diff-cold", "ckptinspect diff", "TF script (max abs diff per key)"),
                            ("verify-cold", "ckptinspect verify", "TF: get_tensor of every key"),
                            ("scan-cold", "ckptinspect scan", "read each checkpoint once: TF get_tensor of every key")):
        x, y = med(results, pid, ours), med(results, pid, peer)
        add(f"(context) {pid}: {ours} vs {peer}, both with a cold page cache",
            f"{y.median / x.median:.2f}x ({x.median:.3f} s vs {y.median:.3f} s)" if x and y else None, None)
    return rows


def orbax_targets(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Issue 24's targets on two 1 GB Orbax steps: against orbax's own scripts (with their JAX import);
    ``ls --stats`` beside orbax's and tensorstore's reads as context (issue 28)."""
    rows: list[list[str]] = []
    for pid, ours, peer, factor in (("ls-orbax", "ckptinspect ls", "orbax metadata API script", 10),
                                    ("diff-orbax", "ckptinspect diff", "orbax restore both + numpy", 3)):
        x, y = med(results, pid, ours), med(results, pid, peer)
        rows.append(_verdict(f"{ours.split()[1]} of a 1 GB Orbax step >= {factor}x faster than the {peer} (issue 24)",
                             f"{y.median / x.median:.2f}x ({x.median:.3f} s vs {y.median:.3f} s)" if x and y else None,
                             y.median >= factor * x.median if x and y else None))
    peaks = [(pid, med(results, pid, ours)) for pid, ours in (("ls-orbax", "ckptinspect ls"), ("diff-orbax", "ckptinspect diff"))]
    peaks = [(pid, m) for pid, m in peaks if m]
    rows.append(_verdict("ls and diff of 1 GB Orbax steps under 200 MiB peak (issue 24)",
                         ", ".join(f"{pid}: {mib(m.peak)} MiB" for pid, m in peaks) if peaks else None,
                         all(m.peak < 200 * MIB for _, m in peaks) if peaks else None))
    stats = med(results, "ls-stats-orbax", "ckptinspect ls --stats")
    for peer in ("orbax restore + numpy statistics", "tensorstore read + numpy statistics"):
        y = med(results, "ls-stats-orbax", peer)
        rows.append(_verdict(f"(context) ls --stats of a 1 GB Orbax step vs {peer} (issue 28)",
                             f"{y.median / stats.median:.2f}x ({stats.median:.3f} s, {mib(stats.peak)} MiB vs "
                             f"{y.median:.3f} s, {mib(y.peak)} MiB)" if stats and y else None, None))
    return rows


def _verdict(target: str, measured: str | None, ok: bool | None) -> list[str]:
    """One row of the verdict table: ``[target, measured, verdict]``."""
    return [target, measured or "not measured", "n/a" if ok is None else ("met" if ok else "**missed**")]


def _giant_memory(cmd: str, fmt: str, what: str, m: c.Measurement | None, base: c.Measurement | None,
                  size: int | None) -> tuple[str, str | None, bool | None]:
    """The memory target of a giant file: the peak above the baseline (the same command on a
    small file of the same generator: interpreter, imports, fixed buffers) at most 3x the header
    or index. A 5.6 MiB index is below the interpreter's own ~20 MiB, so the absolute peak alone
    could never meet it; both are shown."""
    target = f"{cmd} of the giant {fmt} file: peak memory above the baseline <= 3x {what} (issue 28)"
    if not (m and base and size):
        return target, None, None
    above = m.peak - base.peak
    return (target, f"{mib(m.peak)} MiB - {mib(base.peak)} MiB = {mib(above)} MiB vs limit {mib(3 * size)} MiB "
                    f"({above / size:.1f}x {what})", above <= 3 * size)


def _giant_memory_slope(cmd: str, m: c.Measurement | None, smaller: c.Measurement | None,
                        index_bytes: Callable[[int], int | None]) -> tuple[str, str | None, bool | None]:
    """The TF index's memory target: the peak's growth from the smaller file on the same code
    path (columns, numpy imported: the fixed costs in both) to the giant one, at most 3x the
    index's growth. The peak above the 100-entry baseline is shown beside it as context: that
    baseline takes the record path and never imports numpy."""
    lo, hi = bench_many.TF_SAME_PATH_VARIABLES, bench_many.TF_INDEX_VARIABLES
    target = (f"{cmd} of the giant tf file: peak memory growth <= 3x the index's growth, "
              f"{lo:,} -> {hi:,} variables on the same code path (issue 28)")
    small_index, big_index = index_bytes(lo), index_bytes(hi)
    if not (m and smaller and small_index and big_index):
        return target, None, None
    grew, limit = m.peak - smaller.peak, 3 * (big_index - small_index)
    return (target, f"{mib(m.peak)} MiB - {mib(smaller.peak)} MiB = {mib(grew)} MiB vs limit {mib(limit)} MiB "
                    f"({grew / (big_index - small_index):.1f}x the index's growth)", grew <= limit)


def _tf_index_bytes(variables: int) -> int | None:
    path = bench_many.giant_tf_path(c.DEFAULT_WORK if _WORK is None else _WORK, variables) + ".index"
    return os.path.getsize(path) if os.path.isfile(path) else None


def _giant_header_bytes() -> int | None:
    path = bench_many.giant_safetensors_path(c.DEFAULT_WORK if _WORK is None else _WORK)
    return bench_many.header_bytes(path) if os.path.isfile(path) else None


def _giant_index_bytes() -> int | None:
    return _tf_index_bytes(bench_many.TF_INDEX_VARIABLES)


_WORK: pathlib.Path | None = None  # the work folder of this run (set by main)


# -- the scale plot -----------------------------------------------------------------------
def plot_scale(scale: list[dict[str, Any]], path: pathlib.Path) -> str:
    """Plot time and peak memory against checkpoint size; return a line saying what happened."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: PLC0415
    except ImportError:
        return "matplotlib is not installed (pip install -e .[bench]): no plot written"
    colors = {"ls": "tab:blue", "ls-stats": "tab:purple", "diff": "tab:orange", "diff-h5": "tab:red", "verify": "tab:green",
              "scan": "tab:brown", "average": "tab:pink", "extract": "tab:olive"}
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 7.4))
    sizes = [p["bytes"] / MIB for p in scale]
    handles, names = [], []
    for cmd in SCALE_COMMANDS:
        labels: list[str] = []
        for point in scale:
            labels += [k for k in point["results"].get(cmd, {}) if k not in labels]
        for label in labels:
            xs, ts, lo, hi, ms = [], [], [], [], []
            for x, point in zip(sizes, scale):
                m = point["results"].get(cmd, {}).get(label)
                if isinstance(m, c.Measurement):
                    xs.append(x)
                    ts.append(m.median)
                    lo.append(m.median - min(m.times))
                    hi.append(max(m.times) - m.median)
                    ms.append(m.peak / MIB)
            if not xs:
                continue
            ours = label.startswith("ckptinspect")
            style = dict(color=colors[cmd], marker="o" if ours else "s", linestyle="-" if ours else "--",
                         linewidth=2 if ours else 1.2, markersize=6 if ours else 5)
            line = ax_t.errorbar(xs, ts, yerr=[lo, hi], capsize=3, **style)
            ax_m.plot(xs, ms, **style)
            handles.append(line)
            names.append(label if ours and cmd in ("ls", "diff", "verify") else f"{cmd}: {label}")

    def nice(v: float, _pos: Any = None) -> str:
        return f"{v:g}" if v < 10 else f"{v:,.0f}"

    def ticks(ax: Any, candidates: list[float]) -> None:
        lo, hi = ax.get_ylim()
        ax.yaxis.set_major_locator(FixedLocator([v for v in candidates if lo <= v <= hi]))
        ax.yaxis.set_major_formatter(FuncFormatter(nice))
        ax.yaxis.set_minor_locator(NullLocator())

    steps = [k * 10**e for e in range(-2, 5) for k in (1, 2, 5)]
    for ax in (ax_t, ax_m):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_major_formatter(FuncFormatter(nice))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("checkpoint size, MiB (diff reads A and B: twice that)")
        ax.grid(True, which="major", alpha=0.3)
    ticks(ax_t, steps)
    ticks(ax_m, steps)
    ax_t.set_ylabel("wall time, median (s); bars: min-max")
    ax_t.set_title("time vs checkpoint size")
    ax_m.set_ylabel("peak RSS of the process (MiB)")
    ax_m.set_title("peak memory vs checkpoint size")
    fig.suptitle(f"ckptinspect (solid) vs TensorFlow or read-once baselines (dashed): whole processes, {scale[0]['entries']} variables, "
                 f"{os.cpu_count()} cores", fontsize=11)
    # The legend (up to 3 columns) gets its own band below the axes, sized by its rows.
    rows = -(-len(names) // 3)
    band = min(0.45, 0.03 + 0.028 * rows)
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, band, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot written to {path}"


# -- the report ---------------------------------------------------------------------------
def _measured_pair(pair: Pair, results: dict[str, dict[str, Any]]) -> tuple[Any, list[tuple[str, Any]]]:
    """ckptinspect's measurement of a pair (None when it failed or did not run) and each
    alternative's ``(label, measurement)`` that ran."""
    measured = results.get(pair.id, {})
    ours = next((t for t in pair.tools if t.ours), None)
    m = measured.get(ours.label) if ours else None
    if not isinstance(m, c.Measurement) or m.median <= 0:
        return None, []
    return m, [(t.label, measured[t.label]) for t in pair.tools
               if t is not ours and not t.label.startswith("ckptinspect") and isinstance(measured.get(t.label), c.Measurement)]


def summary_rows(pairs: list[Pair], results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One row per pair measured: ckptinspect's median and peak beside every alternative's, with
    the ratio (the alternative's median over ours): the summary the README quotes."""
    rows = []
    for pair in pairs:
        m, peers = _measured_pair(pair, results)
        if m is not None:
            rows.append([f"`{pair.id}`", f"{m.median:.3f} s, {mib(m.peak)} MiB",
                         "; ".join(f"{label} {p.median:.3f} s, {mib(p.peak)} MiB ({p.median / m.median:.2f}x)"
                                   for label, p in peers) or "-"])
    return rows


def ratio_rows(pairs: list[Pair], results: dict[str, dict[str, Any]]) -> list[tuple[str, float]]:
    """``(pair: alternative, its median over ckptinspect's)`` for every pair measured, in order."""
    rows = []
    for pair in pairs:
        m, peers = _measured_pair(pair, results)
        rows += [(f"{pair.id}: {label}", p.median / m.median) for label, p in peers]
    return rows


def plot_ratios(rows: list[tuple[str, float]], path: pathlib.Path) -> str:
    """Every pair's ratios in one chart (log scale, right of 1x: ckptinspect faster); a line
    saying what happened."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "matplotlib is not installed (pip install -e .[bench]): no plot written"
    if not rows:
        return "no pair measured: no ratio plot written"
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.26 * len(rows)))
    ys = list(range(len(rows)))[::-1]
    values = [r for _, r in rows]
    ax.barh(ys, values, color=["tab:green" if v >= 1 else "tab:red" for v in values], height=0.7)
    ax.set_yticks(ys, [name for name, _ in rows], fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=1)
    for y, v in zip(ys, values):
        ax.text(v, y, f" {v:.2f}x", va="center", fontsize=7)
    ax.set_xlabel("the peer's median time over ckptinspect's (log scale; right of 1: ckptinspect faster)")
    ax.set_title(f"every pair, one run: whole processes, {os.cpu_count()} cores", fontsize=10)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"ratio plot written to {path}"


def write_results(path: pathlib.Path, args: argparse.Namespace, info: dict[str, Any], s: c.CheckpointSet,
                  pairs: list[Pair], unavailable: list[Pair], results: dict[str, dict[str, Any]],
                  targets: list[list[str]], scale: list[dict[str, Any]], floor_peak: int | None,
                  plot_line: str | None, notes: str, checks: list[list[str]], ratio_line: str | None = None) -> None:
    meta = s.meta
    mem = info["memory_bytes"]
    v = info["versions"]
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `python benchmarks/run.py {' '.join(args.argv)}`".rstrip() + f" on {info['date']}.",
        "Every tool runs as a whole process (interpreter start and imports included), the tools of a",
        f"pair alternating, the order reversed each round; {args.warmup} untimed warm-up run(s) per tool first",
        f"(page cache warm), then {args.rounds} timed round(s): the median wall time, the spread (max - min) and",
        "the largest peak RSS of the tool (`ru_maxrss` from `os.wait4`, taken by a bare launcher process:",
        "the tool's own peak, not this process's, with a floor of ~9 MiB). Ratio: the tool's median over",
        "ckptinspect's (above 1 means ckptinspect is faster). ckptinspect's bytecode is compiled first, as",
        "`pip install` does (an editable install under `PYTHONDONTWRITEBYTECODE=1` would compile it on every run).",
        "",
        "## Machine",
        "",
        f"- {info['cores']} cores, {mem / 2**30:.1f} GiB memory, {info['cpu']}, {info['os']}" if mem else f"- {info['cores']} cores, {info['cpu']}",
        f"- Python {info['python']}; tensorflow {v['tensorflow']}, keras {v['keras']}, tf_keras {v['tf_keras']}, "
        f"h5py {v['h5py']}, numpy {v['numpy']}, protobuf {v['protobuf']}; {info['h5ls']}",
        f"- ckptinspect {v['ckptinspect']} at commit {info['ckptinspect_commit']}",
        f"- 1-minute load average: {info['load_start']:.2f} when timing started, {info['load_end']:.2f} at the end"
        + (f" (waited {info['waited'] / 60:.0f} min for it to drop below {args.quiet_load})" if info.get("waited") else ""),
        "",
        "## Checkpoints",
        "",
        f"A Keras 3 chain of {meta['layers']} Dense layers ({meta['units']} units; the first takes a "
        f"{c.BIG_FACTOR}x wider input) with its Adam state, saved by `tf.train.Checkpoint(model=..., optimizer=...)`: "
        f"{meta['entries']} variables ({meta['model_weights']} model weights, {meta['optimizer_variables']} optimizer), "
        f"{mib(meta['tensor_bytes'])} MiB of float32, largest tensor {mib(meta['largest_tensor_bytes'])} MiB. "
        f"B is A with every {c.PERTURB_EVERY}th tensor ({meta['perturbed']}) perturbed by N(0, {c.PERTURB_SCALE:g}).",
        "",
        table(["file", "MiB"], [[FILE_LABELS.get(k, k), mib(n)] for k, n in meta["files"].items() if not k.endswith("_files")]
              + ([["multi-shard: data files", meta["files"]["sharded_data_files"]]] if "sharded_data_files" in meta["files"] else [])),
        "",
        "Checks (untimed) that the commands do their job on these files:",
        "",
        table(["check", "expected", "got", "verdict"], checks, align="llll") if checks else "(none run)",
        "",
        "## Targets (issues 8, 14, 15, 16, 24, 26, 28 and 29)",
        "",
        table(["target", "measured", "verdict"], targets, align="lll"),
        "",
        "## Summary",
        "",
        "Every pair of this run: ckptinspect's median time and peak RSS, then each alternative's and",
        "its ratio (the alternative's time over ckptinspect's; above 1 means ckptinspect is faster).",
        "",
        table(["pair", "ckptinspect", "alternatives"], summary_rows(pairs, results), align="lll"),
        "",
        "## Pairs",
        "",
    ]
    if ratio_line and ratio_line.startswith("ratio plot written"):
        lines += [f"![every pair's ratio, one run]({os.path.relpath(args.ratio_plot_path, path.parent)})", ""]
    elif ratio_line:
        lines += [f"({ratio_line})", ""]
    for pair in pairs:
        runs = []
        if pair.rounds is not None and pair.rounds < args.rounds:
            runs.append(f"{pair.rounds} timed run(s)")
        if pair.warmup is not None and pair.warmup < args.warmup:
            runs.append("no warm-up" if pair.warmup == 0 else f"{pair.warmup} warm-up run(s)")
        lines += [f"### `{pair.id}`: {pair.title}" + (f" ({', '.join(runs)})" if runs else ""), "",
                  table(["tool", "median s", "spread s", "peak MiB", "time vs ckptinspect"], pair_rows(pair, results.get(pair.id, {})), align="lrrrl"), ""]
        if pair.id in REMOTE_REQUESTS:
            lines += ["Requests (one more run each, counted by the proxy): "
                      + "; ".join(f"{label} {n}" for label, n in REMOTE_REQUESTS[pair.id].items()) + ".", ""]
    if unavailable:
        lines += ["### Not available", ""]
        lines += [f"- `{p.id}`: `ckptinspect {p.command}` does not exist yet" for p in unavailable]
        lines.append("")
    if scale:
        lines += ["## Scale series", "",
                  f"{', '.join(f'`{k}`' for k in SCALE_COMMANDS)} against checkpoint size ({scale[0]['entries']} variables at every size; "
                  "diff compares A with its perturbed copy B, so it reads twice the bytes; scan reads a run of "
                  f"{c.RUN_CHECKPOINTS} checkpoints, average three; their baselines read the same bytes once). "
                  + (f"Baseline for diff's memory target: `ckptinspect diff` peak on a {FLOOR_MB} MB pair with the same "
                     f"variables, {mib(floor_peak)} MiB." if floor_peak else ""), ""]
        rows = []
        for point in scale:
            for cmd in SCALE_COMMANDS:
                for label, m in point["results"].get(cmd, {}).items():
                    if isinstance(m, c.Measurement):
                        rows.append([f"{point['size_mb']} MB ({mib(point['bytes'])} MiB)", f"`{cmd}`", label, f"{m.median:.3f}", f"{m.spread:.3f}",
                                     mib(m.peak), f"{mib(point['largest_tensor_bytes'])}"])
                    else:
                        rows.append([f"{point['size_mb']} MB", f"`{cmd}`", label, "failed", "", "", str(m).splitlines()[0][:100]])
        lines += [table(["size", "series", "tool", "median s", "spread s", "peak MiB", "largest tensor MiB"], rows, align="lllrrrr"), ""]
        if plot_line and plot_line.startswith("plot written"):
            lines += [f"![time and peak memory against checkpoint size]({os.path.relpath(args.plot_path, path.parent)})", ""]
        elif plot_line:
            lines += [f"({plot_line})", ""]
    lines += ["## Notes", "", notes, ""]
    path.write_text("\n".join(lines))


def to_json(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {p: {k: (m.to_dict() if isinstance(m, c.Measurement) else m) for k, m in r.items()} for p, r in results.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="size of the main checkpoint (default 1024)")
    ap.add_argument("--variables", type=int, default=2000, help="variables in each TF bundle (default 2000)")
    ap.add_argument("--rounds", type=int, default=3, help="timed runs per tool (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per tool first (default 1)")
    ap.add_argument("--only", help="comma-separated pair ids or patterns: ls, ls-sharded, ls-h5, ls-weights-h5, ls-stats, diff, "
                    "diff-h5, extract, extract-weights-h5, transplant, transplant-weights-h5, average, verify, verify-sharded, ls-safetensors, "
                    "ls-pt, ls-kw3-N, diff-kw3-N (N: 100, 2000, 20000), scan-quarters, {ls,verify,diff}-giant-{safetensors,tf}, "
                    "{ls,diff,verify,scan}-cold, scan, ls-orbax, diff-orbax, ls-stats-orbax, ls-remote-{tf,safetensors,pt,h5,npz}, "
                    "diff-remote-{tf,safetensors}; ls*, diff*...")
    ap.add_argument("--scale", default="100,1024,4096", help="checkpoint sizes (MB) of the scale series; '' for none")
    ap.add_argument("--scale-rounds", type=int, help="timed runs per tool in the scale series (default: --rounds)")
    ap.add_argument("--scale-baselines", action=argparse.BooleanOptionalAction, default=True, help="time TensorFlow in the scale series too")
    ap.add_argument("--work", default=str(c.DEFAULT_WORK), help="where checkpoints are generated and cached")
    ap.add_argument("--results", default=str(RESULTS), help="the Markdown report to write")
    ap.add_argument("--plot", default=str(PLOT), help="the scale plot to write")
    ap.add_argument("--ratio-plot", default=str(RATIO_PLOT), help="the plot of every pair's ratio to write")
    ap.add_argument("--wait-quiet", action="store_true", help="wait for the load average to drop first")
    ap.add_argument("--quiet-load", type=float, default=1.0, help="load average to wait for (default 1.0)")
    ap.add_argument("--max-wait", type=float, default=40, help="minutes to wait at most (default 40)")
    args = ap.parse_args(argv)
    args.argv = argv
    if args.rounds < 1 or args.warmup < 0:
        ap.error("--rounds must be >= 1 and --warmup >= 0")
    try:
        sizes = [int(x) for x in args.scale.replace(" ", "").split(",") if x]
    except ValueError:
        ap.error(f"--scale: comma-separated integers expected. Received: {args.scale!r}")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    work = pathlib.Path(args.work).resolve()
    global _WORK
    _WORK = work
    results_path = pathlib.Path(args.results).resolve()
    plot_path = args.plot_path = pathlib.Path(args.plot).resolve()
    args.ratio_plot_path = pathlib.Path(args.ratio_plot).resolve()
    for tool in ("h5ls", "h5diff"):
        if shutil.which(tool) is None:
            log(f"warning: {tool} not found (Debian: apt-get install hdf5-tools); its rows are skipped")

    main_layout = c.layout_for(args.size_mb, args.variables)
    floor_layout = c.layout_for(min(FLOOR_MB, args.size_mb), args.variables)
    scale_layouts = [c.layout_for(mb, args.variables) for mb in sizes]
    # Pairs are chosen before generating so that only the needed kinds are written.
    probe = c.CheckpointSet(main_layout, work / main_layout.name, {})
    try:
        chosen = select(make_pairs(probe, work / "_out"), args.only)
    except ValueError as exc:
        ap.error(str(exc))
    commands = cli_commands()
    need = {"bundle"}
    for p in chosen:
        if "sharded" in p.id:
            need.add("sharded")
        if p.id == "average":
            need.add("third")
        if p.id in ("ls-h5", "diff-h5"):
            need.add("h5")
        if p.id in ("ls-weights-h5", "transplant-weights-h5"):
            need.add("weights_h5")
    wanted = [(main_layout, need)]
    run_scale = bool(scale_layouts) and (not args.only or any(p.id in SCALE_SERIES for p in chosen))
    if any(p.id == "diff" for p in chosen) or run_scale:
        wanted.append((floor_layout, {"bundle"}))
    if run_scale:
        wanted += [(lay, {"bundle", "h5", "third"}) for lay in scale_layouts]
    sets = c.ensure_checkpoints(wanted, work, log=log)
    s = sets[main_layout.name]
    pairs = select(make_pairs(s, work / "_out"), args.only)
    if any(p.id in bench_torch.PAIR_IDS for p in pairs) and _torch_missing() is None:
        log("writing the .safetensors / .pt files (torch)")
        bench_torch.ensure_files(work, s.layout.size_mb, s.layout.variables)
    if any(p.id in ("scan", "scan-cold") for p in pairs):
        c.ensure_run(s)
    bench_many.ensure({p.id for p in pairs}, work, log=log)
    if any(p.id in bench_orbax.PAIR_IDS for p in pairs) and bench_orbax.orbax_python():
        log("the two Orbax steps (written by orbax once, then reused)")
        bench_orbax.ensure_steps(work, bench_orbax.orbax_python())
    log("compiling ckptinspect's bytecode, as pip install does")
    c.compile_package()
    available = [p for p in pairs if p.command in commands]
    unavailable = [p for p in pairs if p.command not in commands]
    for p in unavailable:
        log(f"{p.id}: not available (no `ckptinspect {p.command}` command yet)")

    checks = sanity_checks(s, {p.id for p in available}, commands, work)
    for row in checks:
        log(f"check: {row[0]}: expected {row[1]}, got {row[2]} ({row[3]})")
    info = c.machine()
    if args.wait_quiet:
        waited, _ = c.wait_for_quiet(args.quiet_load, args.max_wait * 60, log=log)
        info["waited"] = waited
    info["load_start"] = c.load_average()
    info["date"] = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")

    results: dict[str, dict[str, Any]] = {}
    stack = contextlib.ExitStack()
    proxy = None
    if any(p.id.startswith(("ls-remote-", "diff-remote-")) for p in available):
        sources = _remote_sources(s, work)
        root = bench_remote.link_tree(work / "remote_http", sources)
        proxy = stack.enter_context(bench_remote.http_store(root, REMOTE_LATENCY_MS, port=_remote_port()))
    for pair in available:
        start = time.perf_counter()
        res = c.time_tools(pair.tools, min(args.rounds, pair.rounds or args.rounds),
                           args.warmup if pair.warmup is None else min(args.warmup, pair.warmup), env=s.env(), cwd=str(work))
        results[pair.id] = res
        if proxy is not None and pair.id.startswith(("ls-remote-", "diff-remote-")):
            count_remote_requests(pair, proxy, s.env(), str(work))
            log(f"  requests: {REMOTE_REQUESTS.get(pair.id)}")
        summary = ", ".join(f"{k} {v.median:.2f}s/{mib(v.peak)}MiB" if isinstance(v, c.Measurement) else f"{k} FAILED" for k, v in res.items())
        log(f"{pair.id} ({time.perf_counter() - start:.0f} s): {summary}")
        for k, v in res.items():
            if isinstance(v, str):
                log(f"  {k}: {v}")

    if proxy is not None:
        big = next((k for k in ("tf_a/ckpt.data-00000-of-00001", "st_a.safetensors") if k in sources), None)
        if big is not None:
            rtt, one, eight = bench_remote.link_profile(proxy.endpoint + "/" + big, sources[big].stat().st_size, s.env())
            REMOTE_LINK.update(rtt_s=rtt, one_stream_bytes_s=one, eight_streams_bytes_s=eight)
    stack.close()

    floor_peak = None
    if floor_layout.name in sets and "diff" in commands:
        fs = sets[floor_layout.name]
        res = c.time_tools([c.Tool("ckptinspect diff", [*CKPT, "diff", fs.a, fs.b], ok_codes=(1,), ours=True)], max(1, args.rounds), args.warmup, env=fs.env(), cwd=str(work))
        m = res["ckptinspect diff"]
        floor_peak = m.peak if isinstance(m, c.Measurement) else None

    scale: list[dict[str, Any]] = []
    if run_scale:
        for lay in scale_layouts:
            ss = sets[lay.name]
            c.ensure_run(ss)
            point = {"size_mb": lay.size_mb, "bytes": ss.meta["files"]["a"], "entries": ss.meta["entries"],
                     "largest_tensor_bytes": ss.meta["largest_tensor_bytes"], "results": {}}
            for cmd, tools in scale_tools(ss, args.scale_baselines, work / "_out").items():
                if SCALE_SERIES[cmd] not in commands:
                    continue
                if lay == main_layout and cmd in results:  # the same runs as the main pair
                    point["results"][cmd] = {t.label: results[cmd][t.label] for t in tools if t.label in results[cmd]}
                    if len(point["results"][cmd]) == len(tools):
                        continue
                start = time.perf_counter()
                rounds = args.rounds if args.scale_rounds is None else args.scale_rounds
                point["results"][cmd] = c.time_tools(tools, rounds, args.warmup, env=ss.env(), cwd=str(work))
                log(f"scale {lay.size_mb} MB {cmd} ({time.perf_counter() - start:.0f} s)")
            scale.append(point)
    info["load_end"] = c.load_average()

    plot_line = plot_scale(scale, plot_path) if scale else None
    if plot_line:
        log(plot_line)
    ratio_line = plot_ratios(ratio_rows(available, results), args.ratio_plot_path)
    log(ratio_line)
    targets = evaluate_targets(results, s, floor_peak, scale)
    notes = read_notes(results_path)
    write_results(results_path, args, info, s, pairs, unavailable, results, targets, scale, floor_peak, plot_line, notes, checks,
                  ratio_line)
    (work / "results.json").write_text(json.dumps({"machine": info, "meta": s.meta, "pairs": to_json(results), "floor_peak": floor_peak,
                                                    "scale": [{**p, "results": to_json(p["results"])} for p in scale], "targets": targets,
                                                    "remote": {"requests": REMOTE_REQUESTS, "link": REMOTE_LINK,
                                                               "latency_ms": REMOTE_LATENCY_MS}}, indent=1))
    log(f"results written to {results_path}")
    for row in targets:
        log(f"  {row[2]:>10}  {row[0]}: {row[1]}")
    failed = [f"{p}: {k}" for p, r in results.items() for k, v in r.items() if isinstance(v, str)]
    failed += [row[0] for row in checks if row[3] != "ok"]
    for what in failed:
        log(f"FAILED: {what}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
