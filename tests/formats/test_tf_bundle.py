"""The TF bundle reader against TensorFlow's own view of real checkpoints.

Ground truth comes from ``tf.train.load_checkpoint`` (keys, shapes, dtypes, values) and from
how each checkpoint was written (shards, slices, steps); never from ckptinspect itself.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import ckptinspect
from ckptinspect.formats.tf import index as _bundle_index
from ckptinspect.formats.tf import bundle as tf_bundle

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"


def assert_matches_tensorflow(ckpt: ckptinspect.Checkpoint, read_values: bool = True) -> None:
    """Keys, shapes, dtypes (and values) equal what TensorFlow reports for the same prefix."""
    reader = tf.train.load_checkpoint(ckpt.path) if os.path.basename(ckpt.path) else None
    if reader is None:
        from tensorflow.python.training import py_checkpoint_reader

        reader = py_checkpoint_reader.NewCheckpointReader(ckpt.path)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    shapes.pop(OBJECT_GRAPH, None)
    assert sorted(shapes) == sorted(v.key for v in ckpt)
    for var in ckpt:
        assert list(var.shape) == list(shapes[var.key]), var.key
        expected = {"half": "float16", "string": "string"}.get(dtypes[var.key].name, dtypes[var.key].name)
        assert var.dtype == expected, var.key
        if read_values:
            ours, theirs = ckpt.read(var), reader.get_tensor(var.key)
            assert np.array_equal(np.asarray(ours), np.asarray(theirs)), var.key


# -- checkpoints written here by real TensorFlow / Keras ---------------------------------------
def _keras3_model():
    inp = keras.Input((8,), name="x")
    encoder = keras.Sequential([keras.layers.Dense(16, name="enc_dense")], name="encoder")
    out = keras.layers.Dense(4, name="head")(encoder(inp))
    return keras.Model(inp, out, name="net")


@pytest.fixture(scope="module")
def keras3_ckpt(tmp_path_factory):
    """A Keras 3 model + Adam, one training step, saved by tf.train.Checkpoint (two saves)."""
    d = tmp_path_factory.mktemp("k3")
    model = _keras3_model()
    opt = keras.optimizers.Adam(1e-2)
    model.compile(opt, "mse")
    x, y = np.random.RandomState(0).rand(32, 8), np.random.RandomState(1).rand(32, 4)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    step = tf.Variable(4, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, step=step)
    manager = tf.train.CheckpointManager(ckpt, str(d / "run"), max_to_keep=2)
    manager.save(checkpoint_number=4)
    step.assign(8)
    manager.save(checkpoint_number=8)
    options = tf.train.CheckpointOptions(
        experimental_sharding_callback=tf.train.experimental.MaxShardSizePolicy(max_shard_size=300)
    )
    sharded = ckpt.write(str(d / "sharded" / "ckpt"), options=options)
    return {"dir": d / "run", "latest": manager.latest_checkpoint, "sharded": sharded, "model": model}


def test_keras3_checkpoint_matches_tensorflow(keras3_ckpt):
    ckpt = ckptinspect.open(keras3_ckpt["latest"])
    assert ckpt.format == "tf-bundle"
    assert ckpt.info["kind"] == "tf2-object"
    assert_matches_tensorflow(ckpt)


def test_keras3_weights_under_optimizer_are_model_role_with_readable_names(keras3_ckpt):
    ckpt = ckptinspect.open(keras3_ckpt["latest"])
    model = keras3_ckpt["model"]
    model_vars = ckpt.filter(role="model")
    # Every weight of the model, named by its Keras path, keyed where TF put it.
    assert sorted(v.name for v in model_vars) == sorted(w.path for w in model.weights)
    kernel = ckpt["encoder/enc_dense/kernel"]
    assert kernel.key.startswith("optimizer/_trainable_variables/")
    assert kernel.role == "model"
    np.testing.assert_array_equal(ckpt.read("encoder/enc_dense/kernel"), model.get_layer("encoder").get_layer("enc_dense").kernel.numpy())
    # Adam's momentums/velocities, iterations and learning rate are optimizer state.
    optimizer = ckpt.filter(role="optimizer")
    assert len(optimizer) == 2 * len(model.trainable_weights) + 2
    assert {v.role for v in ckpt if v.key.startswith(("save_counter", "step"))} == {"metadata"}


def test_step_from_step_variable_and_number_from_filename(keras3_ckpt):
    ckpt = ckptinspect.open(keras3_ckpt["latest"])
    assert (ckpt.step, ckpt.step_source) == (8, "variable:step")
    assert (ckpt.number, ckpt.number_source) == (8, "name:checkpoint")
    assert "filename" not in ckpt.info["step_candidates"]  # a name's number is never a step candidate
    assert ckpt.info["step_candidates"]["save_counter"] == 2


def test_directory_lists_retained_checkpoints(keras3_ckpt):
    ckpt = ckptinspect.open(str(keras3_ckpt["dir"]))
    state = tf.train.get_checkpoint_state(str(keras3_ckpt["dir"]))
    assert ckpt.path == state.model_checkpoint_path
    assert [c.path for c in ckpt.checkpoints] == list(state.all_model_checkpoint_paths)
    assert [(c.step, c.number) for c in ckpt.checkpoints] == [(4, 4), (8, 8)]
    assert [c.timestamp for c in ckpt.checkpoints] == pytest.approx(list(state.all_model_checkpoint_timestamps))
    assert [c.latest for c in ckpt.checkpoints] == [False, True]
    assert all(c.exists for c in ckpt.checkpoints)


def test_max_shard_size_policy_slices_and_shards(keras3_ckpt):
    prefix = keras3_ckpt["sharded"]
    ckpt = ckptinspect.open(prefix)
    data_files = sorted(pathlib.Path(prefix).parent.glob("ckpt.data-*"))
    assert ckpt.num_shards == len(data_files) > 1
    assert_matches_tensorflow(ckpt)
    kernel = ckpt["encoder/enc_dense/kernel"]  # 8*16*4 = 512 bytes > 300: split across files
    assert kernel.sliced and len(kernel.shards) > 1
    assert kernel.shape == (8, 16) and kernel.nbytes == 512
    assert sum(s.nbytes for s in kernel.slices) == 512
    # The bytes each shard holds, by our index reading, add up to each data file's size on disk.
    held = {i: 0 for i in range(len(data_files))}
    for var in ckpt:
        for piece in var.slices or [var]:
            shard = piece.shard if var.slices else var.shards[0]
            held[shard] += piece.nbytes
    held[ckpt.info["object_graph"]["shard"]] += ckpt.info["object_graph"]["nbytes"]
    assert held == {i: f.stat().st_size for i, f in enumerate(data_files)}
    assert all(size <= 300 or i == ckpt.info["object_graph"]["shard"] for i, size in held.items())


def test_tf1_partitioned_variable_is_one_entry(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        emb = tf.compat.v1.get_variable(
            "emb", shape=[10, 4], partitioner=tf.compat.v1.fixed_size_partitioner(3)
        )
        w = tf.compat.v1.get_variable("dense/kernel", shape=[4, 2])
        # Model variables whose names end like Keras slot names are still model weights.
        odd = [tf.compat.v1.get_variable(n, shape=[2]) for n in ("proj/linear", "attn/m", "rnn/momentum")]
        loss = tf.reduce_sum(tf.matmul(tf.concat(list(emb), 0), w)) + sum(tf.reduce_sum(v) for v in odd)
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=gs)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            prefix = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=gs)
    ckpt = ckptinspect.open(prefix)
    assert ckpt.info["kind"] == "tf1-name"
    assert_matches_tensorflow(ckpt)
    emb_var = ckpt["emb"]
    assert emb_var.shape == (10, 4) and len(emb_var.slices) == 3 and emb_var.nbytes == 160
    assert [s.lengths[0] for s in emb_var.slices] == [4, 3, 3]
    assert (ckpt.step, ckpt.step_source) == (1, "variable:global_step")
    roles = {v.key: v.role for v in ckpt}
    assert roles["dense/kernel"] == "model" and roles["emb"] == "model"
    assert roles["proj/linear"] == roles["attn/m"] == roles["rnn/momentum"] == "model"
    assert roles["proj/linear/Adam"] == roles["attn/m/Adam_1"] == "optimizer"
    assert roles["dense/kernel/Adam"] == roles["dense/kernel/Adam_1"] == "optimizer"
    assert roles["beta1_power"] == "optimizer" and roles["global_step"] == "metadata"


def test_dtypes_and_odd_shapes(tmp_path):
    values = {
        "bf16": tf.Variable(tf.constant([1.5, -2.0], dtype=tf.bfloat16)),
        "f16": tf.Variable(tf.constant([[0.5]], dtype=tf.float16)),
        "flag": tf.Variable(True),
        "count": tf.Variable(np.int32(7)),
        "empty": tf.Variable(tf.zeros([0, 3])),
        "text": tf.Variable(tf.constant(["héllo", "wörld"])),
        "ünïcode_näme": tf.Variable(3.0),
    }
    prefix = tf.train.Checkpoint(**values).write(str(tmp_path / "odd"))
    ckpt = ckptinspect.open(prefix)
    assert_matches_tensorflow(ckpt)
    by_name = {v.name: v for v in ckpt}
    assert by_name["bf16"].dtype == "bfloat16" and by_name["bf16"].nbytes == 4
    assert by_name["empty"].shape == (0, 3) and by_name["empty"].nbytes == 0
    assert by_name["text"].dtype == "string"
    assert list(ckpt.read("text")) == [b"h\xc3\xa9llo", b"w\xc3\xb6rld"]
    assert "ünïcode_näme" in by_name


def test_ram_filesystem(tmp_path):
    v = tf.Variable(tf.range(6, dtype=tf.float32))
    prefix = tf.train.Checkpoint(v=v).write("ram://ckptinspect-test/ckpt")
    ckpt = ckptinspect.open(prefix)
    assert ckpt.path == "ram://ckptinspect-test/ckpt"
    np.testing.assert_array_equal(ckpt.read("v"), np.arange(6, dtype=np.float32))
    assert ckptinspect.open("ram://ckptinspect-test").path == prefix


def test_listing_does_not_import_tensorflow(keras3_ckpt):
    code = (
        "import sys, ckptinspect\n"
        f"c = ckptinspect.open({str(keras3_ckpt['dir'])!r})\n"
        "assert len(c) > 0\n"
        "from ckptinspect.cli import app\n"
        "from click.testing import CliRunner\n"
        f"r = CliRunner().invoke(app, ['ls', {str(keras3_ckpt['dir'])!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "print('tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the real-world corpus -----------------------------------------------------------------------
REALWORLD_PREFIXES = [
    "tf2-gan-lstm-2opt/training_checkpoints/btc/ckpt-132",
    "tf2-gan-lstm-2opt/training_checkpoints/btc/ckpt-133",
    "tf2-a2c-ckptmanager/training_checkpoints/ckpt-2",
    "tf2-a2c-ckptmanager/training_checkpoints/ckpt-3",
    "tf2-a2c-ckptmanager/training_checkpoints/ckpt-4",
    "tf2-wgan-2shard/training_checkpoints/ckpt-3149",
    "tf2-gan-kerasnewopt/model/model.ckpt-1",
    "tf2-textgen-keras-weights/training_checkpoints/ckpt_1",
    "tf2-seq2seq-tf112-eager/training_checkpoints/ckpt-11",
    "tf2-nmt-objgraph-only/training_checkpoints/ckpt-2",
    "tf1-estimator-linear-2shard/model.ckpt-0",
    "tf1-estimator-linear-2shard/model.ckpt-5000",
    "tf1-estimator-tf2-ftrl/model.ckpt-0",
    "tf1-estimator-tf2-ftrl/model.ckpt-200",
    "savedmodel-tf1-half-plus-two/saved_model_half_plus_two_cpu/00000123/variables/variables",
    "savedmodel-tf2-half-plus-two/saved_model_half_plus_two_tf2_cpu/00000123/variables/variables",
    "savedmodel-keras-stale-shard/variables/variables",
    "broken/tf1-empty-prefix/model.ckpt",
]


@pytest.mark.parametrize("prefix", REALWORLD_PREFIXES)
def test_realworld_bundle_matches_tensorflow(realworld, prefix):
    ckpt = ckptinspect.open(str(realworld / prefix))
    assert_matches_tensorflow(ckpt)


def test_realworld_empty_basename_prefix(realworld):
    """`dir/.index` is a checkpoint TF's load_checkpoint cannot reach; we open it, not model.ckpt."""
    d = realworld / "broken/tf1-empty-prefix"
    ckpt = ckptinspect.open(str(d / ".index"))
    assert ckpt.path == str(d) + "/"
    assert_matches_tensorflow(ckpt)
    other = ckptinspect.open(str(d / "model.ckpt"))
    differ = [v.key for v in ckpt if not np.array_equal(ckpt.read(v), other.read(v.key))]
    assert len(differ) == 33  # MANIFEST: 33 of 37 tensors differ between the two
    listed = ckptinspect.open(str(d))
    assert listed.path == str(d / "model.ckpt")
    assert [(c.path, c.in_state_file) for c in listed.checkpoints] == [
        (str(d / "model.ckpt"), True),
        (str(d) + "/", False),
    ]


def test_realworld_shards(realworld):
    wgan = ckptinspect.open(str(realworld / "tf2-wgan-2shard/training_checkpoints/ckpt-3149"))
    assert wgan.num_shards == 2
    assert [v.key for v in wgan if v.shards == (0,)] == ["save_counter/.ATTRIBUTES/VARIABLE_VALUE"]
    assert sum(v.shards == (1,) for v in wgan) == 27
    linear = ckptinspect.open(str(realworld / "tf1-estimator-linear-2shard/model.ckpt-5000"))
    assert [v.key for v in linear if v.shards == (0,)] == ["global_step"]
    stale = ckptinspect.open(str(realworld / "savedmodel-keras-stale-shard"))
    assert stale.format == "tf-savedmodel" and stale.num_shards == 2
    assert {s for v in stale for s in v.shards} == {1}
    assert stale.info["object_graph"]["shard"] == 0  # shard 0 holds only the object graph
    assert stale.info["object_graph"]["nodes"] == 202


def test_realworld_steps(realworld):
    cases = {
        "tf1-estimator-linear-2shard": (5000, "variable:global_step"),
        "tf1-estimator-tf2-ftrl": (200, "variable:global_step"),
        # two optimizers that each count the same iterations: the first one's, named
        "tf2-gan-lstm-2opt/training_checkpoints/btc": (25935, "optimizer:discriminator_optimizer/iter"),
        "tf2-a2c-ckptmanager/training_checkpoints": (1096148, "optimizer:actor_optimizer/iter"),
        "tf2-wgan-2shard/training_checkpoints": (None, None),  # only a save counter: no training step
    }
    numbers = {"tf1-estimator-linear-2shard": 5000, "tf1-estimator-tf2-ftrl": 200,
               "tf2-gan-lstm-2opt/training_checkpoints/btc": 133, "tf2-a2c-ckptmanager/training_checkpoints": 4,
               "tf2-wgan-2shard/training_checkpoints": 3149}
    for path, expected in cases.items():
        ckpt = ckptinspect.open(str(realworld / path))
        assert (ckpt.step, ckpt.step_source) == expected, path
        assert (ckpt.number, ckpt.number_source) == (numbers[path], "name:checkpoint"), path
    lstm = ckptinspect.open(str(realworld / "tf2-gan-lstm-2opt/training_checkpoints/btc/ckpt-132"))
    assert lstm.info["step_candidates"]["save_counter"] == 132
    assert lstm.info["step_candidates"]["optimizer:generator_optimizer/iter"] == 25740
    a2c = ckptinspect.open(str(realworld / "tf2-a2c-ckptmanager/training_checkpoints"))
    assert a2c.info["step_candidates"]["optimizer:actor_optimizer/iter"] == 1096148


def test_realworld_roles(realworld):
    def counts(path):
        ckpt = ckptinspect.open(str(realworld / path))
        return {r: len(ckpt.filter(role=r)) for r in ckptinspect.ROLES}, ckpt

    # MANIFEST: Adam slots in .OPTIMIZER_SLOT form, 40 slot variables.
    c, ckpt = counts("tf2-gan-lstm-2opt/training_checkpoints/btc")
    assert sum(".OPTIMIZER_SLOT" in v.key for v in ckpt.filter(role="optimizer")) == 40
    assert all(".OPTIMIZER_SLOT" not in v.key for v in ckpt.filter(role="model"))
    assert any("moving_mean" in v.name for v in ckpt.filter(role="model"))
    # New Keras optimizer layout: 36 `_variables` + iterations + learning rate per optimizer;
    # the generator's weights are keyed under `discriminator/` yet are model weights.
    c, ckpt = counts("tf2-gan-kerasnewopt/model")
    assert c == {"model": 12, "optimizer": 40, "metadata": 1}
    assert not any(v.key.startswith("generator/") for v in ckpt)
    # int32 episode_counter next to save_counter is metadata.
    c, ckpt = counts("tf2-a2c-ckptmanager/training_checkpoints")
    assert {v.name for v in ckpt.filter(role="metadata")} == {"episode_counter", "save_counter"}
    assert c["optimizer"] == 36 + 10
    # TF1 AdamOptimizer in eager: beta powers are optimizer; config JSON strings are metadata.
    c, ckpt = counts("tf2-seq2seq-tf112-eager/training_checkpoints")
    assert c == {"model": 10, "optimizer": 22, "metadata": 7}
    # TF1 Estimator FTRL slots (part_0/Ftrl) and Keras-v2 graph-mode slots (training/Ftrl/...).
    c, _ = counts("tf1-estimator-linear-2shard")
    assert c == {"model": 13, "optimizer": 26, "metadata": 1}
    c, _ = counts("tf1-estimator-tf2-ftrl")
    assert c == {"model": 10, "optimizer": 26, "metadata": 1}


def test_realworld_v1_table_files(realworld):
    export = realworld / "tf1-v1-session-bundle/half_plus_two/00000123/export-00000-of-00001"
    ckpt = ckptinspect.open(str(export))
    assert ckpt.format == "tf-v1-table"
    assert {v.key: float(ckpt.read(v)) for v in ckpt} == {"a": 0.5, "b": 2.0}
    assert ckptinspect.open(str(export.parent)).path == str(export)
    # A state file with an absolute path from another machine: fall back to the basename.
    bad = realworld / "broken/tf1-v1-abs-state-path/bad_half_plus_two/00000123"
    ckpt = ckptinspect.open(str(bad))
    assert ckpt.path == str(bad / "export")
    assert {v.key: float(ckpt.read(v)) for v in ckpt} == {"Variable": 0.5, "Variable_1": 2.0}


def test_realworld_stale_state_file_falls_back(realworld):
    """The state file lists ckpt-3145..3149 but only 3149 exists."""
    ckpt = ckptinspect.open(str(realworld / "tf2-wgan-2shard/training_checkpoints"))
    assert [(c.number, c.exists) for c in ckpt.checkpoints] == [
        (3145, False), (3146, False), (3147, False), (3148, False), (3149, True)
    ]
    assert ckpt.path.endswith("ckpt-3149")


# -- parser unit checks on real index bytes --------------------------------------------------------
def test_parse_index_snappy_compressed_blocks(realworld):
    """The TF Serving SavedModels store snappy-compressed index blocks."""
    prefix = realworld / "savedmodel-tf2-half-plus-two/saved_model_half_plus_two_tf2_cpu/00000123/variables/variables"
    data = pathlib.Path(str(prefix) + ".index").read_bytes()
    index = _bundle_index.parse_index(data)
    keys = {e.key for e in index.entries}
    assert keys == set(tf.train.load_checkpoint(str(prefix)).get_variable_to_shape_map())


def test_index_entries_agree_with_data_files(keras3_ckpt):
    """Offsets and sizes point inside the shard, and the stored crc32c matches the bytes."""
    from ckptinspect.formats.tf.crc import masked_crc32c

    prefix = keras3_ckpt["latest"]
    index = _bundle_index.read_index(prefix)
    data = pathlib.Path(tf_bundle.data_path(prefix, 0, index.num_shards)).read_bytes()
    for entry in index.entries:
        if entry.slices or entry.dtype == "string":  # string crcs cover lengths too (verify's tests)
            continue
        assert entry.offset + entry.size <= len(data)
        assert masked_crc32c(data[entry.offset : entry.offset + entry.size]) == entry.crc32c, entry.key


def test_string_values_keep_trailing_nul_bytes(tmp_path):
    prefix = tf.train.Checkpoint(
        s=tf.Variable(b"ab\x00\x00"), v=tf.Variable([b"x\x00", b"y"])
    ).write(str(tmp_path / "strings"))
    ckpt = ckptinspect.open(prefix)
    assert ckpt.read("s")[()] == b"ab\x00\x00"
    assert list(ckpt.read("v")) == [b"x\x00", b"y"]
