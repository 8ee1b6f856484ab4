"""`ckptinspect average`: mean / EMA of checkpoints of one run, checked against numpy over the
values TensorFlow reads, and restored into the model with TensorFlow's own API.

Inputs are real: the three checkpoints the trainer's CheckpointManager retains in
``fixtures/run`` (Keras 3 + Adam under MirroredStrategy), a TF1 Saver run with partitioned
variables written here, and a float16/bfloat16/float64 run written here with
``tf.train.Checkpoint``. Ground truth comes from ``tf.train.load_checkpoint``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect import _atomic
from ckptinspect.cli import app
from ckptinspect.errors import OutputExistsError, UsageError
from ckptinspect.ops.average.arithmetic import Combiner

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from ckptinspect import trainer  # noqa: E402
from ckptinspect.trainer import net as trainer_net  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
FLOATS = ("float16", "bfloat16", "float32", "float64")
runner = CliRunner()


def tf_values(prefix) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(prefix))
    return {k: np.asarray(reader.get_tensor(k)) for k in reader.get_variable_to_shape_map() if k != GRAPH_KEY}


def tf_dtypes(prefix) -> dict[str, str]:
    reader = tf.train.load_checkpoint(str(prefix))
    return {k: d.name for k, d in reader.get_variable_to_dtype_map().items() if k != GRAPH_KEY}


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def numpy_mean(arrays: list[np.ndarray]) -> np.ndarray:
    """The reference the issue names: numpy's mean of the stacked inputs in float64, rounded once."""
    return np.mean(np.stack(arrays).astype(np.float64), axis=0).astype(arrays[0].dtype)


def is_averaged(key: str, dtype: str) -> bool:
    return dtype in FLOATS and not key.startswith(("save_counter", "step"))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> pathlib.Path:
    """The trainer's CheckpointManager directory (3 retained checkpoints), copied."""
    root = tmp_path_factory.mktemp("avg") / "run"
    shutil.copytree(FIXTURES / "run", root)
    return root


@pytest.fixture(scope="module")
def averaged(run, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("avg_out") / "avg"
    report = ckptinspect.average([str(run)], str(out), last=3)
    return {"out": out, "report": report}


def test_mean_of_three_retained_checkpoints_equals_numpy_bit_for_bit(run, averaged):
    report, out = averaged["report"], averaged["out"]
    prefixes = [str(run / f"ckpt-{s}") for s in (4, 6, 8)]
    assert [(i.path, i.step, i.newest) for i in report.inputs] == [(p, s, s == 8) for p, s in zip(prefixes, (4, 6, 8))]
    inputs = [tf_values(p) for p in prefixes]
    dtypes = tf_dtypes(prefixes[-1])
    got = tf_values(out)
    assert set(got) == set(inputs[-1])  # every key of the newest, nothing else
    assert tf_dtypes(out) == dtypes
    n_avg = 0
    for key, value in got.items():
        if is_averaged(key, dtypes[key]):
            assert same_bits(value, numpy_mean([x[key] for x in inputs])), key
            n_avg += 1
        else:  # integers (Adam's iteration), the step, save_counter: the newest's
            assert same_bits(value, inputs[-1][key]), key
    assert n_avg == report.averaged["all"]["count"] == 23
    assert report.copied["all"]["count"] == 3 and report.verified == 26
    # the values did change (a mean of equal values would prove nothing)
    kernel = next(v.key for v in report.variables if v.name == "encoder/enc_dense/kernel")
    assert not same_bits(got[kernel], inputs[-1][kernel])


def test_output_keeps_the_newest_object_graph_and_restores_into_the_model(run, averaged):
    out = averaged["out"]
    newest = tf.train.load_checkpoint(str(run / "ckpt-8"))
    assert tf.train.load_checkpoint(str(out)).get_tensor(GRAPH_KEY) == newest.get_tensor(GRAPH_KEY)
    model = trainer.build_model(seed=5)
    optimizer = keras.optimizers.Adam(learning_rate=0.5, name=trainer_net.OPTIMIZER_NAME)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    root = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    counter = root.save_counter  # created on first use, as when the trainer saved
    root.read(str(out)).assert_consumed()
    assert int(counter.numpy()) == int(newest.get_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE"))
    assert int(step.numpy()) == 8
    assert int(optimizer.iterations.numpy()) == int(newest.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"))
    values = tf_values(out)
    key = next(v.key for v in averaged["report"].variables if v.name == "encoder/enc_dense/kernel")
    kernel = model.get_layer("encoder").get_layer("enc_dense").kernel.numpy()
    assert same_bits(kernel, values[key]) and not same_bits(kernel, newest.get_tensor(key))


def test_role_model_writes_only_the_model_and_restores_assert_consumed(run, tmp_path):
    out = tmp_path / "m"
    report = ckptinspect.average([str(run)], str(out), last=3, role="model")
    assert report.averaged["model"]["count"] == 10 and report.dropped["optimizer"]["count"] == 14
    assert report.object_graph["pruned"] and report.copied["all"]["count"] == 0
    fresh = trainer.build_model(seed=7)
    tf.train.Checkpoint(model=fresh).read(str(out)).assert_consumed()
    inputs = [tf_values(run / f"ckpt-{s}") for s in (4, 6, 8)]
    got = tf_values(out)
    assert len(got) == 10
    assert not any("optimizer" in k or k.startswith("save_counter") for k in got)
    by_path = {v.output_key: v.key for v in report.variables if v.output_key}
    for key, value in got.items():
        assert same_bits(value, numpy_mean([x[by_path[key]] for x in inputs])), key


def test_ema_equals_hand_computed_reference(run, tmp_path):
    out = tmp_path / "ema"
    decay = 0.75
    # given newest first: the EMA runs in step order all the same
    report = ckptinspect.average([str(run / "ckpt-8"), str(run / "ckpt-4"), str(run / "ckpt-6")], str(out), ema=decay)
    assert report.method == "ema" and [i.step for i in report.inputs] == [4, 6, 8]
    x4, x6, x8 = (tf_values(run / f"ckpt-{s}") for s in (4, 6, 8))
    got = tf_values(out)
    dtypes = tf_dtypes(out)
    for key in got:
        if not is_averaged(key, dtypes[key]):
            assert same_bits(got[key], x8[key])
            continue
        e = x4[key].astype(np.float64)
        e = decay * e + (1 - decay) * x6[key].astype(np.float64)
        e = decay * e + (1 - decay) * x8[key].astype(np.float64)
        assert same_bits(got[key], e.astype(x8[key].dtype)), key
    # one element by hand, in Python floats (float64)
    key = next(k for k in got if got[k].ndim == 2)
    a, b, c = (float(x[key].reshape(-1)[3]) for x in (x4, x6, x8))
    want = np.float32(0.75 * (0.75 * a + 0.25 * b) + 0.25 * c)
    assert got[key].reshape(-1)[3] == want


def test_verify_passes_on_the_output_and_inputs_are_untouched(run, averaged):
    assert ckptinspect.verify(str(averaged["out"])).intact
    assert _atomic.leftover_temporaries(str(averaged["out"].parent)) == []
    for s in (4, 6, 8):
        a = (FIXTURES / "run" / f"ckpt-{s}.data-00000-of-00001").read_bytes()
        assert (run / f"ckpt-{s}.data-00000-of-00001").read_bytes() == a


def test_disagreeing_shapes_are_one_error_listing_them(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for path, width in ((a, 3), (b, 5)):
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width, name="d"), keras.layers.Dense(2, name="h")])
        tf.train.Checkpoint(model=m).write(str(path))
    result = runner.invoke(app, ["average", str(a), str(b), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: the checkpoints do not agree (3 differences): ")
    assert "shape [4,3] in " in lines[0] and "[4,5] in the newest" in lines[0] and "shape [3] in" in lines[0]
    assert not list(tmp_path.glob("out*"))


def test_missing_keys_are_listed_first_few_and_counted(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    tf.train.Checkpoint(**{f"v{i}": tf.Variable(float(i)) for i in range(8)}).write(str(a))
    tf.train.Checkpoint(w=tf.Variable(1.0)).write(str(b))
    with pytest.raises(UsageError) as e:
        ckptinspect.average([str(a), str(b)], str(tmp_path / "out"))
    assert "(9 differences)" in str(e.value) and "(+4 more)" in str(e.value) and "is missing in" in str(e.value)


def test_output_exists_refused_then_force_replaces(run, tmp_path):
    out = tmp_path / "o"
    ckptinspect.average([str(run / "ckpt-4"), str(run / "ckpt-6")], str(out))
    with pytest.raises(OutputExistsError):
        ckptinspect.average([str(run / "ckpt-4"), str(run / "ckpt-6")], str(out))
    report = ckptinspect.average([str(run / "ckpt-6"), str(run / "ckpt-8")], str(out), force=True)
    assert report.newest.step == 8
    # the output may not change what the source directory resolves to: without its state file the
    # run resolves to its newest *.index, which a new "avg" would be
    loose = tmp_path / "loose"
    shutil.copytree(run, loose)
    (loose / "checkpoint").unlink()
    result = runner.invoke(app, ["average", "--last", "2", str(loose), "-o", str(loose / "avg")])
    assert result.exit_code == 2 and result.stderr.startswith(f"Error: {loose}/avg: would add avg.index to {loose}")
    assert not list(loose.glob("avg*"))


def test_cli_json_and_argument_errors(run, tmp_path):
    result = runner.invoke(app, ["average", "--last", "2", str(run), "-o", str(tmp_path / "j"), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["method"] == "mean" and doc["decay"] is None and doc["newest"].endswith("ckpt-8")
    assert [i["step"] for i in doc["inputs"]] == [6, 8] and doc["verified"] == 26
    assert doc["averaged"]["all"]["count"] == 23 and {v["action"] for v in doc["variables"]} == {"averaged", "copied"}
    for args, text in (
        (["--last", "4", str(run)], "retains 3 checkpoints; --last asks for 4"),
        (["--last", "2", str(run), str(run)], "either checkpoints or --last"),
        ([str(run), "--ema", "1.5"], "EMA decay"),
        ([str(run), "--role", "optimizer"], "--role takes 'model'"),
        ([str(FIXTURES / "keras")], ""),
    ):
        result = runner.invoke(app, ["average", *args, "-o", str(tmp_path / "x")])
        assert result.exit_code == 2 and result.stderr.count("Error:") == 1 and text in result.stderr, (args, result.stderr)
    result = runner.invoke(app, ["average", str(run), "-o", str(tmp_path / "x.safetensors")])
    assert result.exit_code == 2 and "unknown output suffix" in result.stderr


# -- TF1 partitioned variables -----------------------------------------------------------------
@pytest.fixture(scope="module")
def tf1_run(tmp_path_factory) -> list[str]:
    """Three TF1 Saver checkpoints of one graph: a partitioned embedding (3 slices), a kernel
    partitioned along axis 1, a bias, a string and the global step."""
    directory = tmp_path_factory.mktemp("tf1avg")
    v1 = tf.compat.v1
    prefixes = []
    with tf.Graph().as_default():
        emb = v1.get_variable("emb/table", [10, 3], partitioner=v1.fixed_size_partitioner(3),
                              initializer=v1.random_normal_initializer(seed=2))
        ker = v1.get_variable("dense/kernel", [4, 6], partitioner=v1.fixed_size_partitioner(2, axis=1),
                              initializer=v1.random_normal_initializer(seed=3))
        bias = v1.get_variable("dense/bias", [6], initializer=v1.constant_initializer(0.5))
        v1.get_variable("names", initializer=tf.constant([b"a", b"\x00b"]))
        step = v1.train.get_or_create_global_step()
        updates = [*(p.assign(p * 1.7 + 0.3) for p in emb), *(p.assign(p * -1.3 + 0.1) for p in ker),
                   bias.assign(bias * 2.1), step.assign_add(100)]
        saver = v1.train.Saver(max_to_keep=3)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(4):
                sess.run(updates)
                prefixes.append(saver.save(sess, str(directory / "model.ckpt"), global_step=step))
    return prefixes


def test_tf1_partitioned_average_keeps_slices_and_equals_numpy(tf1_run, tmp_path):
    directory = os.path.dirname(tf1_run[0])
    out = tmp_path / "avg.ckpt"
    report = ckptinspect.average([directory], str(out), last=3)
    assert [i.step for i in report.inputs] == [200, 300, 400]
    inputs = [tf_values(p) for p in tf1_run[1:]]
    got = tf_values(out)
    assert set(got) == set(inputs[-1]) == {"emb/table", "dense/kernel", "dense/bias", "names", "global_step"}
    for key in ("emb/table", "dense/kernel", "dense/bias"):
        assert same_bits(got[key], numpy_mean([x[key] for x in inputs])), key
    assert int(got["global_step"]) == 400 and list(got["names"]) == [b"a", b"\x00b"]
    with ckptinspect.open(str(out)) as written, ckptinspect.open(tf1_run[-1]) as newest:
        for key in ("emb/table", "dense/kernel"):
            assert [(s.starts, s.lengths) for s in written[key].slices] == [
                (s.starts, s.lengths) for s in newest[key].slices] and len(written[key].slices) > 1
    assert ckptinspect.verify(str(out)).intact
    # restores into the partitioned graph with TF1's Saver
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        emb = v1.get_variable("emb/table", [10, 3], partitioner=v1.fixed_size_partitioner(3))
        v1.get_variable("dense/kernel", [4, 6], partitioner=v1.fixed_size_partitioner(2, axis=1))
        v1.get_variable("dense/bias", [6])
        v1.get_variable("names", initializer=tf.constant([b"", b""]))
        v1.train.get_or_create_global_step()
        with v1.Session() as sess:
            v1.train.Saver().restore(sess, str(out))
            assert same_bits(sess.run(tf.convert_to_tensor(emb)), got["emb/table"])


# -- dtypes: float16, bfloat16, float64, and the one-element case ---------------------------------
def test_half_precision_and_scalars_equal_numpy(tmp_path):
    rng = np.random.default_rng(3)
    prefixes = []
    for i in range(9):  # nine inputs: numpy sums one-element variables pairwise from there
        values = {
            "h": tf.Variable(rng.normal(size=(5, 7)).astype(np.float16)),
            "b": tf.Variable(tf.constant(rng.normal(size=(33,)).astype(np.float32), dtype=tf.bfloat16)),
            "d": tf.Variable(rng.normal(size=(3, 2)) * 1e10),
            "s": tf.Variable(np.float32(rng.normal() * 1e-3 + 1.0)),
            "one": tf.Variable(rng.normal(size=(1, 1)).astype(np.float32)),
            "n": tf.Variable(np.int32(i)),
        }
        prefixes.append(tf.train.Checkpoint(**values).write(str(tmp_path / f"c{i}")))
    out = tmp_path / "out" / "avg"
    ckptinspect.average(prefixes, str(out))  # no step anywhere: the order given, the last as newest
    inputs = [tf_values(p) for p in prefixes]
    got = tf_values(out)
    for key, value in got.items():
        if tf_dtypes(out)[key] in FLOATS:
            assert same_bits(value, numpy_mean([x[key] for x in inputs])), key
    assert int(got[next(k for k in got if k.startswith("n/"))]) == 8


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
@pytest.mark.parametrize("count", [1, 2, 3, 9, 12])
def test_combiner_blocks_equal_numpy_for_any_block_split(dtype, count):
    rng = np.random.default_rng(count)
    for shape in [(), (1,), (2,), (7,), (4, 5), (70001,)]:  # the last: two chunks of the combiner
        xs = [(rng.normal(size=shape) * 10.0 ** rng.integers(-3, 4)).astype(dtype) for _ in range(count)]
        xs[0].reshape(-1)[:1] = -0.0
        want = numpy_mean(xs)
        size = want.size
        for block in (1, 2, 3, 64) if size < 100 else (size, 40000):
            combiner = Combiner(count, None)
            flat = [x.reshape(-1) for x in xs]
            parts = [combiner.combine([f[i : i + block] for f in flat], np.dtype(dtype), size).copy()
                     for i in range(0, size, block)]
            assert same_bits(np.concatenate(parts).reshape(shape), want), (shape, block)
        e = xs[0].astype(np.float64)
        for x in xs[1:]:
            e = 0.9 * e + (1 - 0.9) * x.astype(np.float64)
        ema = Combiner(count, 0.9)
        got = ema.combine([x.reshape(-1) for x in xs], np.dtype(dtype), e.size)
        assert same_bits(got.reshape(shape), e.astype(dtype)), shape


def test_average_does_not_import_tensorflow(run, tf1_run, tmp_path):
    code = (
        "import sys, ckptinspect\n"
        f"r = ckptinspect.average([{str(run)!r}], {str(tmp_path / 'o')!r}, last=3)\n"
        "assert r.verified == 26, r\n"
        f"r = ckptinspect.average({tf1_run[1:]!r}, {str(tmp_path / 'p')!r}, ema=0.5)\n"  # partitioned: slice by slice
        "assert r.verified == 5 and r.averaged['all']['count'] == 3, r\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'h5py')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_damaged_input_is_an_error_and_nothing_is_written(run, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in (run / "ckpt-6.index", run / "ckpt-6.data-00000-of-00001"):
        shutil.copy(f, bad / f.name)
    data = bad / "ckpt-6.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0x40  # inside a float tensor: its checksum no longer matches
    data.write_bytes(bytes(raw))
    out = tmp_path / "out" / "avg"
    result = runner.invoke(app, ["average", str(run / "ckpt-4"), str(bad / "ckpt-6"), "-o", str(out)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "checksum does not match" in result.stderr and str(data) in result.stderr
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


# -- Keras .weights.h5 --------------------------------------------------------------------------
def test_keras_weights_h5_of_one_run_average_and_load(tmp_path):
    h5py = pytest.importorskip("h5py")
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="d"), keras.layers.Dense(3, name="h")])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    x, y = np.random.default_rng(0).normal(size=(32, 6)), np.random.default_rng(1).normal(size=(32, 3))
    pattern = str(tmp_path / "run" / "w.{epoch:02d}.weights.h5")
    (tmp_path / "run").mkdir()
    model.fit(x, y, epochs=4, batch_size=8, verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(pattern, save_weights_only=True)])
    files = [str(tmp_path / "run" / f"w.{e:02d}.weights.h5") for e in (2, 3, 4)]
    out = tmp_path / "avg.weights.h5"
    report = ckptinspect.average(files[::-1], str(out))  # in step order whatever the order given
    assert [i.step for i in report.inputs] == [8, 12, 16] and report.inputs[-1].path == files[-1]

    def datasets(path):
        with h5py.File(path, "r") as f:
            found = {}
            f.visititems(lambda n, o: found.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
            return found

    inputs = [datasets(p) for p in files]
    got = datasets(out)
    assert set(got) == set(inputs[-1])
    for key, value in got.items():
        if value.dtype.kind == "f":
            assert same_bits(value, numpy_mean([x[key] for x in inputs])), key
        else:
            assert same_bits(value, inputs[-1][key]), key
    assert report.averaged["model"]["count"] == 4 and report.copied["optimizer"]["count"] >= 1
    fresh = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="d"), keras.layers.Dense(3, name="h")])
    fresh.load_weights(str(out))
    kernel = next(v.key for v in report.variables if v.role == "model" and v.shape == (6, 5))
    assert same_bits(fresh.get_layer("d").kernel.numpy(), numpy_mean([x[kernel] for x in inputs]))
    assert not same_bits(fresh.get_layer("d").kernel.numpy(), inputs[-1][kernel])
    with pytest.raises(UsageError, match="--role model writes TF checkpoints only"):
        ckptinspect.average(files, str(tmp_path / "m.weights.h5"), role="model")
    with pytest.raises(UsageError, match="average into a .weights.h5 output"):
        ckptinspect.average(files, str(tmp_path / "prefix"))


def test_tf2_sliced_multi_shard_run_keeps_slices_and_restores(tmp_path):
    """The trainer's MaxShardSizePolicy run (``fixtures/sharded``: variables sliced across 5 data
    files): averaged slice by slice, equal to numpy, restorable into the model."""
    src = tmp_path / "sharded"
    shutil.copytree(FIXTURES / "sharded", src)
    out = tmp_path / "out" / "avg"
    report = ckptinspect.average([str(src)], str(out), last=2)
    inputs = [tf_values(src / f"ckpt-{s}") for s in (2, 4)]
    got = tf_values(out)
    dtypes = tf_dtypes(out)
    assert set(got) == set(inputs[-1])
    for key, value in got.items():
        want = numpy_mean([x[key] for x in inputs]) if is_averaged(key, dtypes[key]) else inputs[-1][key]
        assert same_bits(value, want), key
    with ckptinspect.open(str(out)) as written, ckptinspect.open(str(src / "ckpt-4")) as newest:
        sliced = [v.key for v in newest.variables if v.sliced]
        assert sliced and all(
            [(s.starts, s.lengths) for s in written[k].slices] == [(s.starts, s.lengths) for s in newest[k].slices]
            for k in sliced)
    assert report.averaged["all"]["count"] == 23
    model_out = tmp_path / "out" / "model"
    ckptinspect.average([str(src / "ckpt-2"), str(src / "ckpt-4")], str(model_out), role="model")
    fresh = trainer.build_model(seed=9)
    tf.train.Checkpoint(model=fresh).read(str(model_out)).assert_consumed()


def test_reference_example_is_what_the_command_prints(tmp_path, monkeypatch):
    doc = (FIXTURES.parent / "docs" / "commands" / "average.md").read_text()
    command = "$ ckptinspect average --last 3 fixtures/run -o runs/avg\n"
    shown = doc[doc.index(command) + len(command):]
    shown = shown[: shown.index("```")]
    monkeypatch.chdir(FIXTURES.parent)
    monkeypatch.delenv("COLUMNS", raising=False)
    out = tmp_path / "avg"
    result = runner.invoke(app, ["average", "--last", "3", "fixtures/run", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.replace(str(out), "runs/avg") == shown


def test_a_directory_given_as_one_source_is_refused_pointing_at_last(tmp_path):
    """Issue 25 item 11: ``average RUN`` averaged only RUN's newest checkpoint and exited 0."""
    run = FIXTURES / "run"
    with pytest.raises(UsageError, match=r"a directory of 3 checkpoints, not one; average --last 3 .*run averages them"):
        ckptinspect.average([run], tmp_path / "avg")
    assert not list(tmp_path.iterdir())


def test_one_checkpoint_named_twice_is_refused(tmp_path):
    """Issue 25 item 11: ``ckpt-6`` and ``ckpt-6.index`` were one checkpoint weighted double."""
    run = FIXTURES / "run"
    with pytest.raises(UsageError, match=r"ckpt-6\.index: the same checkpoint as .*ckpt-6 .*each checkpoint counts once"):
        ckptinspect.average([run / "ckpt-6", run / "ckpt-6.index"], tmp_path / "avg")
    assert not list(tmp_path.iterdir())
