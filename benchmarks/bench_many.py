"""Benchmark files with many small objects (issue 28): per-object costs show as a slope.

* Keras 3 ``.weights.h5`` files of N float32 datasets at the same total size (default 200 MB:
  2,000 datasets x 100 KB), laid out as a real Keras 3 model writes them
  (``layers/<name>/vars/<i>``, two variables per layer), written by Keras itself
  (``Sequential.save_weights``) in a child process; B is A with every 4th dataset perturbed by
  N(0, 1e-3) (rewritten in place with h5py on a copy of A).
* A run of 5 TF bundles whose steps change different quarters of the tensors (``scan``'s
  realistic case: each step rewrites another quarter, not a, b, a, b, a), built from the main
  set's A by rewriting every tensor's bytes at their index offsets.
* Giant headers: a ``.safetensors`` file of many tiny tensors (header of about ``header_mb``)
  and a TF bundle with many variables, for ``ls``/``verify``/``diff X X`` at scale.

Everything is generated into the work folder (cached by a ``.done`` marker), never committed.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

COUNTS = (100, 2000, 20000)
TOTAL_MB = 200
PERTURB_EVERY = 4
VARS_PER_LAYER = 2

KERAS_GENERATE = r"""
import sys, numpy as np, keras
count, total, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
per = max(1, total // count // 4)  # float32 elements per dataset

class Block(keras.layers.Layer):
    def build(self, input_shape=None):
        for i in range(%(vars)d):
            self.add_weight(shape=(per,), initializer="random_normal", name=f"w{i}")

blocks = [Block(name=f"block_{i:05d}") for i in range(count // %(vars)d)]
for b in blocks:
    b.build()
model = keras.Sequential(blocks, name="many")
model.built = True
model.save_weights(path)
""" % {"vars": VARS_PER_LAYER}

PERTURB = r"""
import sys, h5py, numpy as np
rng = np.random.default_rng(1)
with h5py.File(sys.argv[1], "r+") as f:
    names = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    for n in names[::%(every)d]:
        d = f[n]
        d[...] = d[()] + rng.normal(0, 1e-3, d.shape).astype(d.dtype)
print(len(names[::%(every)d]))
""" % {"every": PERTURB_EVERY}


def many_h5_paths(work: pathlib.Path, count: int, total_mb: int = TOTAL_MB) -> tuple[str, str]:
    """Where :func:`many_h5` writes the pair of ``count`` datasets (nothing generated)."""
    folder = work / f"many_h5_{total_mb}mb_{count}"
    return str(folder / "a.weights.h5"), str(folder / "b.weights.h5")


def many_h5(work: pathlib.Path, count: int, total_mb: int = TOTAL_MB, log=print) -> tuple[str, str]:
    """``(A, B)``: the Keras 3 ``.weights.h5`` pair of ``count`` datasets (generated once)."""
    folder = work / f"many_h5_{total_mb}mb_{count}"
    a, b = folder / "a.weights.h5", folder / "b.weights.h5"
    done = folder / ".done"
    if not done.exists():
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        log(f"writing a Keras 3 .weights.h5 of {count} datasets ({total_mb} MB) with Keras")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        subprocess.run([sys.executable, "-c", KERAS_GENERATE, str(count), str(total_mb << 20), str(a)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        shutil.copyfile(a, b)
        subprocess.run([sys.executable, "-c", PERTURB, str(b)], check=True, stdout=subprocess.DEVNULL)
        done.touch()
    return str(a), str(b)




# -- scan: a run whose steps change different quarters of the tensors ------------------------
RUN_STEPS = 5
QUARTERS_GENERATE = r"""
import os, sys, numpy as np, tensorflow as tf
folder, total, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
per = max(1, total // n // 4)
rng = np.random.default_rng(0)
values = [rng.standard_normal(per, dtype=np.float32) for _ in range(n)]
names = [f"model/layer_{i:05d}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(n)]
lines = []
for step in range(1, steps + 1):
    if step > 1:  # step k rewrites quarter (k - 2) % 4 of the tensors: a small update
        for i in range((step - 2) % 4, n, 4):
            values[i] = values[i] + rng.normal(0, 1e-3, per).astype(np.float32)
    prefix = os.path.join(folder, f"ckpt-{step}")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * n, tensors=[tf.constant(v) for v in values])
    lines.append(f'all_model_checkpoint_paths: "ckpt-{step}"')
with open(os.path.join(folder, "checkpoint"), "w") as f:
    f.write(f'model_checkpoint_path: "ckpt-{steps}"\n' + "\n".join(lines) + "\n")
"""


def quarters_path(work: pathlib.Path, total_mb: int = TOTAL_MB, variables: int = 2000) -> str:
    return str(work / f"run_quarters_{total_mb}mb_{variables}")


def quarters_run(work: pathlib.Path, total_mb: int = TOTAL_MB, variables: int = 2000, log=print) -> str:
    """A run of 5 TF bundles (``ckpt-1`` .. ``ckpt-5`` and a ``checkpoint`` state file) of
    ``variables`` float32 tensors, ``total_mb`` each; step k changes quarter (k - 2) mod 4 of the
    tensors (every fourth, a different quarter each step): written once by TensorFlow."""
    folder = work / f"run_quarters_{total_mb}mb_{variables}"
    done = folder / ".done"
    if not done.exists():
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        log(f"writing a {RUN_STEPS}-checkpoint run ({total_mb} MB each) whose steps change different quarters, with TensorFlow")
        subprocess.run([sys.executable, "-c", QUARTERS_GENERATE, str(folder), str(total_mb << 20), str(variables), str(RUN_STEPS)],
                       check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        (folder / ".done").touch()
    return str(folder)


# -- giant headers ---------------------------------------------------------------------------
SAFETENSORS_TENSORS = 1_300_000
SAFETENSORS_GENERATE = r"""
import sys, numpy as np
from safetensors.numpy import save_file
n, path = int(sys.argv[1]), sys.argv[2]
# 1.3 million one-element float32 tensors, short names (the safetensors library refuses a header
# over 100 MB): a header of about 92 MB, ~71 bytes per tensor.
state = {f"l{i // 1000:04d}.e{i % 1000:03d}": np.full((1,), i % 97, np.float32) for i in range(n)}
save_file(state, path, metadata={"format": "np"})
"""

TF_INDEX_VARIABLES = 100_000
# The giant files' memory baseline: the same command on a file of this many entries from the same
# generator (the interpreter, the imports and the command's fixed buffers, without the entries).
BASELINE_ENTRIES = 100
# A TF index read into columns from about 1 MiB or 20,000 variables on (COMPACT_MIN_BYTES,
# COMPACT_MIN_VARIABLES); the 100-entry baseline takes the record path and never imports numpy
# (~14 MiB). The TF index's memory target is judged between two files on the columns path: the
# peak's growth from this many variables to TF_INDEX_VARIABLES against 3x the index's growth.
TF_SAME_PATH_VARIABLES = 25_000
TF_MANY_GENERATE = r"""
import sys, numpy as np, tensorflow as tf
n, prefix = int(sys.argv[1]), sys.argv[2]
names = [f"model/block_{i // 100:04d}/layer_{i % 100:02d}/kernel/.ATTRIBUTES/VARIABLE_VALUE" for i in range(n)]
tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * n,
                  tensors=[tf.constant(np.full((4,), i % 97, np.float32)) for i in range(n)])
"""


def giant_safetensors_path(work: pathlib.Path, tensors: int = SAFETENSORS_TENSORS) -> str:
    return str(work / f"giant_safetensors_{tensors}" / "model.safetensors")


def giant_tf_path(work: pathlib.Path, variables: int = TF_INDEX_VARIABLES) -> str:
    return str(work / f"giant_tf_{variables}" / "ckpt")


def giant_safetensors(work: pathlib.Path, tensors: int = SAFETENSORS_TENSORS, log=print) -> str:
    """A ``.safetensors`` file of ``tensors`` tiny tensors (its JSON header ~90 MB at 1.3 million),
    written once by the safetensors library."""
    folder = work / f"giant_safetensors_{tensors}"
    path = folder / "model.safetensors"
    if not (folder / ".done").exists():
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        log(f"writing a .safetensors file of {tensors} tensors with safetensors")
        subprocess.run([sys.executable, "-c", SAFETENSORS_GENERATE, str(tensors), str(path)], check=True)
        (folder / ".done").touch()
    return str(path)


def header_bytes(safetensors_path: str) -> int:
    """The length of a .safetensors file's JSON header (its first 8 bytes, little-endian)."""
    with open(safetensors_path, "rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def giant_tf_index(work: pathlib.Path, variables: int = TF_INDEX_VARIABLES, log=print) -> str:
    """A TF bundle of ``variables`` tiny variables (one index entry each), written once by
    TensorFlow's SaveV2; returns its prefix."""
    folder = work / f"giant_tf_{variables}"
    prefix = folder / "ckpt"
    if not (folder / ".done").exists():
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        log(f"writing a TF bundle of {variables} variables with TensorFlow")
        subprocess.run([sys.executable, "-c", TF_MANY_GENERATE, str(variables), str(prefix)], check=True,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        (folder / ".done").touch()
    return str(prefix)


# -- what run.py needs -----------------------------------------------------------------------
def ensure(pair_ids: set[str], work: pathlib.Path, log=print) -> None:
    """Generate the files the chosen pairs of ``run.py`` need (each once)."""
    for n in COUNTS:
        if f"ls-kw3-{n}" in pair_ids or f"diff-kw3-{n}" in pair_ids:
            many_h5(work, n, log=log)
    if "scan-quarters" in pair_ids:
        quarters_run(work, log=log)
    if any(p.endswith("giant-safetensors") for p in pair_ids):
        giant_safetensors(work, log=log)
        giant_safetensors(work, BASELINE_ENTRIES, log=log)
    if any(p.endswith("giant-tf") for p in pair_ids):
        giant_tf_index(work, log=log)
        giant_tf_index(work, BASELINE_ENTRIES, log=log)
        giant_tf_index(work, TF_SAME_PATH_VARIABLES, log=log)


if __name__ == "__main__":
    ensure({f"{k}-kw3-{n}" for k in ("ls", "diff") for n in COUNTS} | {"scan-quarters", "ls-giant-safetensors", "ls-giant-tf"},
           pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "_work")
