"""The fixture trainer, checked against TensorFlow and Keras themselves.

Training needs logical CPU devices, which can only be set before TensorFlow initialises, so the
trainer runs in fresh subprocesses (two, started together, shared by the whole module): one
calls the library (``regenerate_fixtures`` into a temporary folder, an extra run with an odd
number of steps, and the error cases), one runs the ``ckptinspect train`` command line.

Ground truth is TensorFlow's (``tf.train.load_checkpoint``, ``tf.train.get_checkpoint_state``,
``tf.train.CheckpointManager``, restoring into :func:`ckptinspect.trainer.build_model` with
``tf.train.Checkpoint``) and Keras's (``keras.saving.load_model``), not ckptinspect's.
The committed ``fixtures/`` are checked the same way.
"""

from __future__ import annotations

import glob
import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ckptinspect
from ckptinspect import trainer
from ckptinspect.trainer import fixtures as trainer_fixtures
from ckptinspect.trainer import training
from ckptinspect.errors import OutputExistsError, UsageError

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
STEP_KEY = "step/.ATTRIBUTES/VARIABLE_VALUE"
SUBPROCESS_TIMEOUT = 300

# Runs in a fresh interpreter: library calls, then the error cases, results to result.json.
LIBRARY_SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, os, pathlib, sys
    from ckptinspect import trainer
    from ckptinspect.errors import OutputExistsError, UsageError

    root = pathlib.Path(sys.argv[1])
    out = {}
    fx = trainer.regenerate_fixtures(root / "fx", keras2=trainer.keras2_available())
    out["fx_run"] = dataclasses.asdict(fx["run"])
    out["fx_sharded"] = dataclasses.asdict(fx["sharded"])
    out["fx_keras"] = fx["keras"]
    odd = trainer.train(root / "odd", steps=7, save_every=2, replicas=2, max_to_keep=3, seed=1)
    out["odd"] = dataclasses.asdict(odd)
    out["odd_summary"] = odd.summary()
    try:  # TensorFlow now runs with 2 logical devices: 3 cannot be added
        trainer.train(root / "more", steps=1, replicas=3)
        out["more_error"] = None
    except UsageError as e:
        out["more_error"] = str(e)
    out["more_exists"] = (root / "more").exists()
    trainer.train(root / "forced", steps=1, save_every=1, replicas=2)
    (root / "forced" / "stale.txt").write_text("from the first run")
    trainer.train(root / "forced", steps=2, save_every=1, replicas=2, max_to_keep=1, force=True)

    from click.testing import CliRunner
    from ckptinspect.cli import app
    res = CliRunner().invoke(app, ["train", str(root / "odd"), "--steps", "1"])
    out["cli_refuse"] = {"exit_code": res.exit_code, "output": res.output}
    (root / "result.json").write_text(json.dumps(out))
    """
)

CLI_ARGS = ["train", "OUT", "--steps", "3", "--save-every", "2", "--replicas", "1", "--max-to-keep", "0",
            "--max-shard-bytes", "4096", "--seed", "3"]


def _env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Both subprocesses, run in parallel; their outputs and the library's result.json."""
    root = tmp_path_factory.mktemp("trainer")
    cli_out = root / "cli"
    library = subprocess.Popen(
        [sys.executable, "-c", LIBRARY_SCRIPT, str(root)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    cli = subprocess.Popen(
        [sys.executable, "-m", "ckptinspect", *[str(cli_out) if a == "OUT" else a for a in CLI_ARGS]],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lib_stdout, lib_stderr = library.communicate(timeout=SUBPROCESS_TIMEOUT)
    cli_stdout, cli_stderr = cli.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert library.returncode == 0, lib_stderr[-3000:]
    return {
        "root": root,
        "result": json.loads((root / "result.json").read_text()),
        "cli": {"out": cli_out, "code": cli.returncode, "stdout": cli_stdout, "stderr": cli_stderr},
    }


def restore_model(prefix: str):
    """The checkpoint's model weights, restored by TensorFlow into a fresh build_model()."""
    model = trainer.build_model()
    status = tf.train.Checkpoint(model=model).read(prefix)
    status.assert_existing_objects_matched().expect_partial()
    return {w.path: w.numpy() for w in model.weights}


def tf_shapes(prefix: str) -> dict[str, list[int]]:
    shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    shapes.pop(OBJECT_GRAPH, None)
    return shapes


def state_steps(directory: pathlib.Path) -> list[int]:
    state = tf.train.get_checkpoint_state(str(directory))
    return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


# -- the library run with an odd number of steps ------------------------------------------------


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_retained_checkpoints_and_steps(runs):
    odd = runs["root"] / "odd"
    # Saves at 2, 4, 6 and the last step 7; max_to_keep=3 deleted ckpt-2.
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(), str(odd), max_to_keep=3)
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-4", "ckpt-6", "ckpt-7"]
    assert tf.train.latest_checkpoint(str(odd)) == str(odd / "ckpt-7")
    assert state_steps(odd) == [4, 6, 7]
    assert not glob.glob(str(odd / "ckpt-2.*"))
    for step in (4, 6, 7):
        assert tf.train.load_checkpoint(str(odd / f"ckpt-{step}")).get_tensor(STEP_KEY) == step
    result = runs["result"]["odd"]
    assert result["saved_steps"] == [2, 4, 6, 7]
    assert [os.path.basename(p) for p in result["retained"]] == ["ckpt-4", "ckpt-6", "ckpt-7"]
    assert result["num_shards"] == 1
    assert runs["result"]["odd_summary"].startswith(f"{odd}: trained 7 steps on 2 replicas")


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_metadata_agrees_with_tensorflow(runs):
    odd = runs["root"] / "odd"
    meta = json.loads((odd / trainer.METADATA_FILE).read_text())
    assert (meta["steps"], meta["replicas"], meta["save_every"], meta["max_to_keep"]) == (7, 2, 2, 3)
    assert meta["saved_steps"] == [2, 4, 6, 7]
    assert meta["retained_steps"] == state_steps(odd)
    assert [s["retained"] for s in meta["saved"]] == [False, True, True, True]
    assert meta["latest"] == "ckpt-7"
    losses = {s["step"]: s["loss"] for s in meta["saved"]}
    assert all(math.isfinite(v) and v > 0 for v in losses.values())
    assert {int(k): v for k, v in runs["result"]["odd"]["losses"].items()} == losses
    assert meta["versions"]["tensorflow"] == tf.__version__
    assert meta["versions"]["keras"] == keras.__version__
    # Every recorded weight is in the checkpoint with that shape (TensorFlow's restore and map).
    restored = restore_model(str(odd / "ckpt-7"))
    assert {w["name"]: tuple(w["shape"]) for w in meta["model"]["weights"]} == {
        k: v.shape for k, v in restored.items()
    }
    trainable = {w["name"] for w in meta["model"]["weights"] if w["trainable"]}
    assert "encoder/enc_dense/kernel" in trainable
    assert not {"frozen/kernel", "bn/moving_mean"} & trainable


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_frozen_weights_equal_across_saves_trained_ones_differ(runs):
    odd = runs["root"] / "odd"
    first, last = restore_model(str(odd / "ckpt-4")), restore_model(str(odd / "ckpt-7"))
    initial = {w.path: w.numpy() for w in trainer.build_model(seed=1).weights}
    for name in ("frozen/kernel", "frozen/bias"):
        assert np.array_equal(first[name], last[name]), name
        assert np.array_equal(first[name], initial[name]), name
    for name in ("encoder/enc_dense/kernel", "bn/gamma", "head/kernel", "bn/moving_mean", "bn/moving_variance"):
        assert not np.array_equal(first[name], last[name]), name


def test_seed_changes_the_initial_weights():
    a, b = trainer.build_model(seed=0), trainer.build_model(seed=1)
    assert not np.array_equal(a.get_layer("frozen").kernel.numpy(), b.get_layer("frozen").kernel.numpy())
    c = trainer.build_model(seed=0)
    assert all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a.weights, c.weights))


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_build_model_inside_a_strategy_scope_restores_the_checkpoint(runs):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = trainer.build_model()
    assert isinstance(model.weights[0].value, tf.distribute.DistributedValues)
    prefix = str(runs["root"] / "odd" / "ckpt-7")
    tf.train.Checkpoint(model=model).read(prefix).assert_existing_objects_matched().expect_partial()
    expected = restore_model(prefix)
    assert all(np.array_equal(w.numpy(), expected[w.path]) for w in model.weights)


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_refuses_to_add_devices_after_tensorflow_started(runs):
    message = runs["result"]["more_error"]
    assert message is not None and "already initialised with 2 logical CPU device(s)" in message
    assert "fresh process" in message
    assert not runs["result"]["more_exists"]


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_cli_refuses_non_empty_out(runs):
    refuse = runs["result"]["cli_refuse"]
    assert refuse["exit_code"] == 2
    assert refuse["output"].strip().splitlines()[-1] == (
        f"Error: {runs['root'] / 'odd'}: directory is not empty (pass force=True / --force to replace it)"
    )


def test_library_refuses_non_empty_out_before_touching_tensorflow(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(OutputExistsError, match="directory is not empty"):
        trainer.train(tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "x"
    with pytest.raises(OutputExistsError, match="not a trainer output; refusing to replace it even with force"):
        trainer.train(tmp_path, force=True)
    assert (tmp_path / "keep.txt").read_text() == "x"


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_force_replaces_an_earlier_run(runs):
    forced = runs["root"] / "forced"
    assert sorted(p.name for p in forced.iterdir()) == [
        "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index", trainer.METADATA_FILE
    ]
    assert state_steps(forced) == [2]
    assert json.loads((forced / trainer.METADATA_FILE).read_text())["saved_steps"] == [1, 2]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": 0}, "steps must be at least 1. Received: steps=0"),
        ({"save_every": 0}, "save_every must be at least 1. Received: save_every=0"),
        ({"max_to_keep": 0}, "max_to_keep must be at least 1 or None. Received: max_to_keep=0"),
        ({"max_shard_bytes": 0}, "max_shard_bytes must be at least 1. Received: max_shard_bytes=0"),
        ({"replicas": 0}, "replicas must be at least 1. Received: replicas=0"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(UsageError) as info:
        trainer.train(tmp_path / "out", **kwargs)
    assert str(info.value) == message
    assert not (tmp_path / "out").exists()


# -- the command line in a fresh process ---------------------------------------------------------


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_cli_train(runs):
    cli = runs["cli"]
    assert cli["code"] == 0, cli["stderr"][-3000:]
    out = cli["out"]
    assert f"{out}: trained 3 steps on 1 replicas, saved steps [2, 3], retained [2, 3]" in cli["stderr"]
    assert state_steps(out) == [2, 3]  # --max-to-keep 0 keeps all
    meta = json.loads((out / trainer.METADATA_FILE).read_text())
    assert (meta["replicas"], meta["seed"], meta["max_to_keep"], meta["max_shard_bytes"]) == (1, 3, None, 4096)
    assert not list(out.glob("*.h5"))  # --no-keras by default


# -- regenerate_fixtures into a temporary folder -------------------------------------------------


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_regenerated_run_matches_committed_layout(runs):
    fresh = runs["root"] / "fx"
    for name in trainer_fixtures.FIXTURE_SUBDIRS:
        ours = sorted(p.relative_to(fresh / name).as_posix() for p in (fresh / name).rglob("*") if p.is_file())
        committed = sorted(p.relative_to(FIXTURES / name).as_posix() for p in (FIXTURES / name).rglob("*") if p.is_file())
        if not trainer.keras2_available():
            committed = [p for p in committed if not p.startswith("keras2")]
        assert ours == committed, name
    for name in ("run", "sharded"):
        for prefix in glob.glob(str(fresh / name / "*.index")):
            prefix = prefix[: -len(".index")]
            committed = str(FIXTURES / name / os.path.basename(prefix))
            assert tf_shapes(prefix) == tf_shapes(committed)
    assert not list(fresh.glob(".*")), "temporary folders left behind"
    assert not list(runs["root"].glob(".*")), "temporary folders left behind"


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_sharded_save_spans_several_files(runs):
    sharded = runs["root"] / "fx" / "sharded"
    meta = json.loads((sharded / trainer.METADATA_FILE).read_text())
    assert meta["max_shard_bytes"] == trainer_fixtures.FIXTURE_SHARD_BYTES
    for step in (2, 4):
        prefix = str(sharded / f"ckpt-{step}")
        data = sorted(glob.glob(prefix + ".data-*"))
        assert len(data) == meta["num_shards"] > 1
        assert all(f.endswith(f"-of-{len(data):05d}") for f in data)
        assert all(os.path.getsize(f) <= 4 * trainer_fixtures.FIXTURE_SHARD_BYTES for f in data)
        reader = tf.train.load_checkpoint(prefix)
        with ckptinspect.open(prefix) as ckpt:
            assert ckpt.num_shards == len(data)
            spread = [v for v in ckpt if len(v.shards) > 1]
            assert spread, "no variable sliced across data files"
            assert "frozen/kernel" in {v.name for v in spread}
            for var in spread:
                assert np.array_equal(ckpt.read(var), reader.get_tensor(var.key)), var.name


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_keras_files_hold_the_final_model(runs):
    fx = runs["root"] / "fx"
    final = restore_model(str(fx / "run" / "ckpt-8"))
    assert sorted(os.path.basename(p) for p in runs["result"]["fx_keras"]) == sorted(
        [*trainer.KERAS3_FILES, *(("keras2_model.h5", "keras2_weights.h5", "ckpt") if trainer.keras2_available() else ())]
    )
    for name in (training.KERAS3_ZIP, training.KERAS3_LEGACY_H5):
        loaded = keras.saving.load_model(str(fx / "keras" / name))
        assert [w.shape for w in loaded.weights] == [v.shape for v in final.values()]
        assert all(np.array_equal(w.numpy(), v) for w, v in zip(loaded.weights, final.values())), name
        assert int(loaded.optimizer.iterations.numpy()) == 8, name
    model = trainer.build_model()
    model.load_weights(str(fx / "keras" / training.KERAS3_WEIGHTS))
    assert all(np.array_equal(w.numpy(), final[w.path]) for w in model.weights)


@pytest.mark.slow  # the `runs` fixture trains and regenerates the fixtures (~45 s)
def test_keras2_files(runs):
    tf_keras = pytest.importorskip("tf_keras")
    keras2 = runs["root"] / "fx" / "keras"
    model = tf_keras.models.load_model(str(keras2 / training.KERAS2_MODEL_H5))
    assert model.name == "net" and int(model.optimizer.iterations.numpy()) == 2
    assert tuple(model.get_layer("encoder").get_layer("enc_dense").kernel.shape) == (8, 16)
    assert not model.get_layer("frozen").trainable
    assert len(model.weights) == 10
    shapes = tf_shapes(str(keras2 / training.KERAS2_TF_PREFIX))
    assert any(k.startswith("layer_with_weights-") for k in shapes)
    # tf_keras 2.x's Adam stores its 12 slots as optimizer/_variables/N (not .OPTIMIZER_SLOT).
    assert sum(k.startswith("optimizer/_variables/") for k in shapes) == 12
    assert tf.train.latest_checkpoint(str(keras2 / training.KERAS2_TF_DIR)) == str(keras2 / training.KERAS2_TF_PREFIX)


# -- the committed fixtures --------------------------------------------------------------------


COMMITTED_TF = ["run", "sharded", "keras/keras2_tf"]


@pytest.mark.parametrize("name", COMMITTED_TF)
def test_committed_fixture_opens_and_matches_tensorflow(name):
    directory = FIXTURES / name
    if not directory.is_dir():
        pytest.skip(f"{directory} not committed")
    recorded = [
        line.split(":", 1)[1].strip().strip('"')
        for line in (directory / "checkpoint").read_text().splitlines()
        if "_path" in line.split(":", 1)[0]
    ]
    assert recorded and not any(os.path.isabs(p) or "/" in p for p in recorded), recorded
    state = tf.train.get_checkpoint_state(str(directory))
    with ckptinspect.open(str(directory)) as ckpt:
        assert os.path.abspath(ckpt.path) == os.path.abspath(state.model_checkpoint_path)
        shapes = tf_shapes(ckpt.path)
        assert sorted(ckpt.keys()) == sorted(shapes)
        assert all(list(v.shape) == list(shapes[v.key]) for v in ckpt)
        assert [os.path.abspath(c.path) for c in ckpt.checkpoints] == [
            os.path.abspath(p) for p in state.all_model_checkpoint_paths
        ]
    for prefix in state.all_model_checkpoint_paths:
        with ckptinspect.open(prefix) as each:
            assert sorted(each.keys()) == sorted(tf_shapes(prefix))


def test_committed_fixtures_agree_with_their_metadata():
    for name, steps in (("run", [4, 6, 8]), ("sharded", [2, 4])):
        meta = json.loads((FIXTURES / name / trainer.METADATA_FILE).read_text())
        assert meta["retained_steps"] == state_steps(FIXTURES / name) == steps
        latest = str(FIXTURES / name / meta["latest"])
        assert tf.train.load_checkpoint(latest).get_tensor(STEP_KEY) == steps[-1]
        assert len(glob.glob(latest + ".data-*")) == meta["num_shards"]
    with ckptinspect.open(str(FIXTURES / "sharded")) as ckpt:
        assert ckpt.num_shards > 1
        assert any(len(v.shards) > 1 for v in ckpt)


def test_committed_fixtures_are_small():
    # fixtures/series (folders of real callback checkpoints, ~280 KB: a Keras HDF5 file holds
    # 12-26 KB of HDF5 metadata however small its model) has its own bound of 300 KB in
    # tests/formats/test_series_fixtures.py, and fixtures/orbax (Orbax steps written by Keras on
    # JAX, ~600 KB) its own of 700 KB in tests/formats/test_orbax.py; everything else keeps this one.
    files = [p for p in FIXTURES.rglob("*") if p.is_file() and p.relative_to(FIXTURES).parts[0] not in ("series", "orbax")]
    assert files
    assert sum(p.stat().st_size for p in files) < 512 * 1024


@pytest.mark.parametrize("name", [*trainer.KERAS3_FILES, training.KERAS2_MODEL_H5, training.KERAS2_WEIGHTS_H5])
def test_committed_keras_files_open(name):
    path = FIXTURES / "keras" / name
    if not path.exists():
        pytest.skip(f"{path} not committed")
    if name.endswith(".keras"):
        pytest.importorskip("ckptinspect.formats.keras.zip")
    else:
        pytest.importorskip("ckptinspect.formats.keras.h5")
    with ckptinspect.open(str(path)) as ckpt:
        names = {v.name for v in ckpt.filter(role="model")}
        assert len(names) == 10, sorted(names)
        assert ckpt.filter(role="optimizer") or name == training.KERAS2_WEIGHTS_H5
