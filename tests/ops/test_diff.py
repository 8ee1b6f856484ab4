"""`ckptinspect diff`: alignment, statistics, tolerances, NaN, formats, CLI exit codes.

Ground truth comes from TensorFlow (``tf.train.load_checkpoint``) and numpy, never from
ckptinspect's own reader. Checkpoints are the committed trainer fixtures (``fixtures/``) and
small ones written here by ``tf.train.Checkpoint`` once per module.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.formats.tf.index import read_index
from ckptinspect.ops.diff import operation as d

tf = pytest.importorskip("tensorflow")

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
RUN = FIXTURES / "run"
KERAS = FIXTURES / "keras"
SHARDED = FIXTURES / "sharded"

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["diff", *map(str, args)])


def tf_values(prefix) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(prefix))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def by_key(report) -> dict[str, d.VariableDiff]:
    return {v.key_a or v.key_b: v for v in report.variables}


def write_vars(path: pathlib.Path, values: dict) -> str:
    """``tf.train.Checkpoint(**{name: tf.Variable(value)})`` written to ``path``; nested dicts nest."""

    def build(tree):
        if isinstance(tree, dict):
            module = tf.Module()
            for k, v in tree.items():
                setattr(module, k, build(v))
            return module
        return tf.Variable(tree)

    root = {k: build(v) for k, v in values.items()}
    return tf.train.Checkpoint(**root).write(str(path))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Checkpoints written by TensorFlow for this module.

    * ``base`` / ``perturbed``: the trainer model restored from ``run/ckpt-8`` and written
      again, and the same with one element of ``head/kernel`` changed by +0.25.
    * ``struct_a`` / ``struct_b``: a reshaped, a removed, an added, a retyped, an equal
      and a string variable.
    * ``nan_*``: NaN/Inf patterns; ``enc`` / ``encoder``: the same value under other names.
    """
    import keras

    from ckptinspect import trainer

    root = tmp_path_factory.mktemp("diff")
    out: dict[str, str] = {}

    model = trainer.build_model(0)
    optimizer = keras.optimizers.Adam(learning_rate=0.01, name="adam")
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    ckpt.read(str(RUN / "ckpt-8")).expect_partial()
    out["base"] = ckpt.write(str(root / "base" / "ckpt"))
    head = model.get_layer("head").kernel
    value = head.numpy()
    value[3, 1] += 0.25
    head.assign(value)
    out["perturbed"] = ckpt.write(str(root / "perturbed" / "ckpt"))

    text = np.array([b"alpha", b"beta"], dtype=object)
    out["struct_a"] = write_vars(root / "sa" / "ckpt", {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32),
        "old": np.zeros(2, np.float32), "c": np.array([0.5, 1.5], np.float32), "s": text,
    })
    out["struct_b"] = write_vars(root / "sb" / "ckpt", {
        "w": np.arange(16, dtype=np.float32).reshape(4, 4), "b": np.ones(4, np.float32),
        "new": np.zeros(5, np.float32), "c": np.array([0.5, 1.5], np.float64), "s": text,
    })
    out["strings_changed"] = write_vars(root / "sc" / "ckpt", {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32),
        "old": np.zeros(2, np.float32), "c": np.array([0.5, 1.5], np.float32),
        "s": np.array([b"alpha", b"gamma"], dtype=object),
    })

    nan, inf = np.nan, np.inf
    for name, v in {
        "nan_a": [1.0, nan, 3.0, inf],
        "nan_same": [1.0, nan, 3.0, inf],
        "nan_moved": [1.0, nan, 3.5, inf],
        "nan_gone": [1.0, 2.0, 3.0, inf],
        "inf_flip": [1.0, nan, 3.0, -inf],
    }.items():
        out[name] = write_vars(root / name / "ckpt", {"v": np.array(v, np.float32)})

    for name, x in {"tol_a": [1.0, 2.0, 4.0, -3.0], "tol_b": [1.0, 2.5, 4.0, -3.0]}.items():
        out[name] = write_vars(root / name / "ckpt", {"x": np.array(x, np.float32)})

    # Larger than one streaming block (d.BLOCK_BYTES): identical, and one element off in the last block.
    rng = np.random.default_rng(1)
    big = rng.standard_normal((3, 2 * d.BLOCK_BYTES // 4 // 3 + 1000)).astype(np.float32)
    late = big.copy()
    late[2, -3] += 1e-3
    out["big_a"] = write_vars(root / "big_a" / "ckpt", {"x": big, "y": big[0]})
    out["big_b"] = write_vars(root / "big_b" / "ckpt", {"x": late, "y": big[0]})

    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    out["enc"] = write_vars(root / "enc" / "ckpt", {"enc": {"w": w}})
    out["encoder"] = write_vars(root / "encoder" / "ckpt", {"encoder": {"w": w}})
    return out


# -- two saves of the trainer at different steps ---------------------------------------------
@pytest.fixture(scope="module")
def steps_report():
    return ckptinspect.diff(RUN / "ckpt-4", RUN / "ckpt-8")


def test_two_steps_match_tensorflow(steps_report):
    a, b = tf_values(RUN / "ckpt-4"), tf_values(RUN / "ckpt-8")
    rows = by_key(steps_report)
    assert set(rows) == set(a) == set(b)
    assert steps_report.alignment == d.ALIGN_KEY
    for key, row in rows.items():
        x, y = a[key].astype(np.float64), b[key].astype(np.float64)
        changed = not np.array_equal(x, y)
        assert row.status == ("changed" if changed else "equal"), key
        assert row.max_abs_diff == np.max(np.abs(x - y)), key
        assert row.num_different == np.count_nonzero(x != y)
        if np.linalg.norm(x):
            assert row.rel_l2 == pytest.approx(np.linalg.norm(x - y) / np.linalg.norm(x), rel=1e-12)
        if np.linalg.norm(x) and np.linalg.norm(y):
            cos = float(x.ravel() @ y.ravel() / (np.linalg.norm(x) * np.linalg.norm(y)))
            assert row.cosine == pytest.approx(cos, rel=1e-12, abs=1e-15)
    assert not steps_report.identical


def test_two_steps_trainable_changed_frozen_equal(steps_report):
    meta = json.loads((RUN / "metadata.json").read_text())
    rows = {v.name: v for v in steps_report.variables}
    trainable = [w["name"] for w in meta["model"]["weights"] if w["trainable"]]
    frozen = [w["name"] for w in meta["model"]["weights"] if w["name"].startswith("frozen/")]
    assert trainable and len(frozen) == 2
    assert all(rows[n].status == "changed" and rows[n].rel_l2 > 0 for n in trainable)
    assert all(rows[n].status == "equal" and rows[n].max_abs_diff == 0.0 for n in frozen)


def test_two_steps_table_sorted_and_layers(steps_report):
    statuses = [v.status for v in steps_report.variables]
    first_equal = statuses.index("equal")
    assert all(s == "changed" for s in statuses[:first_equal]) and set(statuses[first_equal:]) == {"equal"}
    moved = [v.movement for v in steps_report.variables[:first_equal]]
    assert moved == sorted(moved, reverse=True)
    layers = {s.layer: s for s in steps_report.layers}
    assert layers["frozen"].changed == 0 and layers["frozen"].variables == 2
    head = [v for v in steps_report.variables if v.layer == "head"]
    assert layers["head"].changed == 2 and layers["head"].max_rel_l2 == max(v.rel_l2 for v in head)


# -- one perturbed element ------------------------------------------------------------------------
def test_one_perturbed_element_found_exactly(written):
    report = ckptinspect.diff(written["base"], written["perturbed"])
    a, b = tf_values(written["base"]), tf_values(written["perturbed"])
    differing = [k for k in a if not np.array_equal(a[k], b[k])]
    assert len(differing) == 1
    (row,) = [v for v in report.variables if v.differs]
    assert row.key_a == differing[0] and row.name == "head/kernel"
    assert row.status == "changed" and row.num_different == 1
    expected = float(np.max(np.abs(a[differing[0]].astype(np.float64) - b[differing[0]].astype(np.float64))))
    assert row.max_abs_diff == expected
    assert report.variables[0] == row  # rows are made when asked: equal, not the same object
    assert report.verdict == f"1 of {len(a)} variables differ: 1 changed (atol=0, rtol=0)"
    # The rewritten copy holds the trainer's values: equal to ckpt-8 on the model weights.
    assert ckptinspect.diff(RUN / "ckpt-8", written["base"], role="model").identical


def test_variables_larger_than_a_block(written):
    a, b = tf_values(written["big_a"]), tf_values(written["big_b"])
    assert a["x/.ATTRIBUTES/VARIABLE_VALUE"].nbytes > 2 * d.BLOCK_BYTES
    rows = {v.name: v for v in ckptinspect.diff(written["big_a"], written["big_b"]).variables}
    assert rows["y"].status == "equal" and rows["y"].cosine == 1.0
    x, y = (v["x/.ATTRIBUTES/VARIABLE_VALUE"].astype(np.float64) for v in (a, b))
    assert rows["x"].status == "changed" and rows["x"].num_different == 1
    assert rows["x"].max_abs_diff == np.max(np.abs(x - y))
    assert rows["x"].rel_l2 == pytest.approx(np.linalg.norm(x - y) / np.linalg.norm(x), rel=1e-12)
    assert rows["x"].cosine == pytest.approx(float(x.ravel() @ y.ravel()) / (np.linalg.norm(x) * np.linalg.norm(y)), rel=1e-12)


def test_corrupted_bytes_are_an_error(written, tmp_path):
    src = pathlib.Path(written["perturbed"])
    for f in src.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    prefix = tmp_path / src.name
    with ckptinspect.open(str(prefix)) as ck:
        var = ck["head/kernel"]
    entry = next(e for e in read_index(str(prefix)).entries if e.key == var.key)
    data = next(tmp_path.glob("*.data-00000-of-00001"))
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 5] ^= 0xFF
    data.write_bytes(bytes(raw))
    result = invoke(written["base"], prefix)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {data}: {var.key!r}: checksum does not match: the bytes have crc32c 0x") and result.stderr.count("\n") == 1


# -- structure: added, removed, reshaped, retyped, strings ---------------------------------------
def test_added_removed_reshaped_retyped(written):
    report = ckptinspect.diff(written["struct_a"], written["struct_b"])
    rows = {v.name: v for v in report.variables}
    assert rows["w"].status == "shape_mismatch" and rows["w"].shape_a == (3, 4) and rows["w"].shape_b == (4, 4)
    assert rows["old"].status == "removed" and rows["old"].key_b is None
    assert rows["new"].status == "added" and rows["new"].key_a is None
    assert rows["c"].status == "dtype_mismatch" and rows["c"].max_abs_diff == 0.0
    assert rows["b"].status == "equal" and rows["s"].status == "equal"
    assert report.summary == {"equal": 2, "changed": 0, "added": 1, "removed": 1, "shape_mismatch": 1,
                              "dtype_mismatch": 1}
    changed_strings = by_key(ckptinspect.diff(written["struct_a"], written["strings_changed"]))
    (s,) = [v for v in changed_strings.values() if v.name == "s"]
    assert s.status == "changed" and s.num_different == 1 and s.max_abs_diff is None


# -- tolerances and NaN ----------------------------------------------------------------------------
@pytest.mark.parametrize("atol,rtol", [(0, 0), (0.5, 0), (0.49, 0), (0, 0.2), (0, 0.19), (0.25, 0.1), (0.2, 0.1)])
def test_tolerance_follows_numpy_isclose(written, atol, rtol):
    a = tf.train.load_checkpoint(written["tol_a"]).get_tensor("x/.ATTRIBUTES/VARIABLE_VALUE").astype(np.float64)
    b = tf.train.load_checkpoint(written["tol_b"]).get_tensor("x/.ATTRIBUTES/VARIABLE_VALUE").astype(np.float64)
    close = np.isclose(a, b, atol=atol, rtol=rtol)
    report = ckptinspect.diff(written["tol_a"], written["tol_b"], atol=atol, rtol=rtol)
    (row,) = report.variables
    assert report.identical == bool(close.all())
    assert row.num_different == int((~close).sum())
    result = invoke(written["tol_a"], written["tol_b"], "--atol", atol, "--rtol", rtol)
    assert result.exit_code == (0 if close.all() else 1)
    assert result.stdout.splitlines()[-1].endswith(f"(atol={atol:g}, rtol={rtol:g})")


def test_nan_equals_nan_and_counts(written):
    same = ckptinspect.diff(written["nan_a"], written["nan_same"]).variables[0]
    assert same.status == "equal" and (same.nan_a, same.nan_b, same.inf_a, same.inf_b) == (1, 1, 1, 1)
    moved = ckptinspect.diff(written["nan_a"], written["nan_moved"]).variables[0]
    assert moved.status == "changed" and moved.max_abs_diff == 0.5 and moved.num_different == 1
    assert moved.nonfinite_mismatch == 0
    gone = ckptinspect.diff(written["nan_a"], written["nan_gone"]).variables[0]
    assert gone.status == "changed" and (gone.nan_a, gone.nan_b) == (1, 0) and gone.nonfinite_mismatch == 1
    assert gone.max_abs_diff == 0.0
    flip = ckptinspect.diff(written["nan_a"], written["inf_flip"]).variables[0]
    assert flip.status == "changed" and flip.nonfinite_mismatch == 1 and flip.movement == float("inf")


# -- names: --map, cross-format, sliced -----------------------------------------------------------
def test_map_rewrites_a_names(written):
    plain = ckptinspect.diff(written["enc"], written["encoder"])
    assert [v.status for v in plain.variables] == ["removed", "added"]
    assert any("--map" in n for n in plain.notes)
    result = invoke(written["enc"], written["encoder"], "--map", "^enc/=encoder/")
    assert result.exit_code == 0, result.output
    mapped = ckptinspect.diff(written["enc"], written["encoder"], mapping=["^enc/=encoder/"])
    assert mapped.identical and mapped.variables[0].name == "encoder/w" and mapped.alignment == "name"


@pytest.mark.parametrize("other", ["model.weights.h5", "model.h5", "model.keras"])
def test_tf_checkpoint_equals_keras_files_of_the_same_model(other):
    import h5py

    report = ckptinspect.diff(RUN / "ckpt-8", KERAS / other, role="model")
    meta = json.loads((RUN / "metadata.json").read_text())
    assert report.identical and len(report.variables) == len(meta["model"]["weights"])
    assert {v.name for v in report.variables} == {w["name"] for w in meta["model"]["weights"]}
    # Ground truth for one pair: the HDF5 dataset read by h5py against TensorFlow's value.
    (row,) = [v for v in report.variables if v.name == "head/kernel"]
    with h5py.File(KERAS / other if other != "model.keras" else KERAS / "model.weights.h5") as f:
        key = row.key_b if other != "model.keras" else "layers/dense_1/vars/0"
        h5_value = f[key][()]
    np.testing.assert_array_equal(h5_value, tf_values(RUN / "ckpt-8")[row.key_a])
    result = invoke(RUN / "ckpt-8", KERAS / other, "--role", "model")
    assert result.exit_code == 0 and result.stdout.splitlines()[-1] == f"all {len(report.variables)} variables equal (atol=0, rtol=0)"


def test_both_names_shown_when_the_sides_name_a_variable_differently():
    table = invoke(RUN / "ckpt-8", KERAS / "model.weights.h5", "--role", "model").stdout.splitlines()
    assert any(line.startswith("head/kernel -> head/vars/0 ") and " equal " in line for line in table)
    doc = json.loads(invoke(RUN / "ckpt-8", KERAS / "model.weights.h5", "--role", "model", "--format", "json").stdout)
    (row,) = [v for v in doc["variables"] if v["name"] == "head/kernel"]
    assert (row["name_a"], row["name_b"], row["matched_by"]) == ("head/kernel", "head/vars/0", "positional")
    rows = list(csv.DictReader(io.StringIO(invoke(RUN / "ckpt-8", KERAS / "model.h5", "--format", "csv").stdout)))
    assert {"name_a", "name_b", "matched_by"} <= set(rows[0])
    assert " -> " not in invoke(RUN / "ckpt-4", RUN / "ckpt-8").stdout  # same names (and shapes, dtypes): one each
    assert {v["matched_by"] for v in json.loads(invoke(RUN / "ckpt-4", RUN / "ckpt-8", "--format", "json").stdout)["variables"]} == {"key"}


def test_keras3_weights_file_aligns_optimizer_too():
    report = ckptinspect.diff(RUN / "ckpt-8", KERAS / "model.weights.h5")
    removed = sorted(v.name for v in report.variables if v.differs)
    assert removed == ["save_counter", "step"]  # counters only a tf.train.Checkpoint has
    assert all(v.status == "removed" for v in report.variables if v.differs)
    assert any("optimizer/vars/N" in n for n in report.notes)


def test_sliced_variables_compared_whole():
    with ckptinspect.open(str(SHARDED / "ckpt-4")) as ck:
        assert any(v.sliced for v in ck)
    a, b = tf_values(SHARDED / "ckpt-4"), tf_values(RUN / "ckpt-4")
    report = ckptinspect.diff(SHARDED / "ckpt-4", RUN / "ckpt-4")
    expect_equal = all(np.array_equal(a[k], b[k]) for k in a)
    assert report.identical == expect_equal and len(report.variables) == len(a)
    changed = ckptinspect.diff(SHARDED / "ckpt-2", SHARDED / "ckpt-4")
    a2 = tf_values(SHARDED / "ckpt-2")
    for row in changed.variables:
        assert row.max_abs_diff == np.max(np.abs(a2[row.key_a].astype(np.float64) - a[row.key_b].astype(np.float64)))


# -- output and exit codes -------------------------------------------------------------------------
def test_json_document_shape():
    result = invoke(RUN / "ckpt-4", RUN / "ckpt-8", "--format", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert {"a", "b", "identical", "atol", "rtol", "variables", "summary"} <= set(doc)
    assert doc["identical"] is False and doc["atol"] == 0.0 and doc["rtol"] == 0.0
    assert set(doc["summary"]) == {"equal", "changed", "added", "removed", "shape_mismatch", "dtype_mismatch"}
    assert sum(doc["summary"].values()) == len(doc["variables"])
    for item in doc["variables"]:
        assert {"name", "key_a", "key_b", "status", "max_abs_diff", "rel_l2", "cosine"} <= set(item)
        assert item["status"] in d.STATUSES
        assert item["max_abs_diff"] is None or isinstance(item["max_abs_diff"], float)


def test_csv_and_table_outputs():
    result = invoke(RUN / "ckpt-4", RUN / "ckpt-8", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert result.exit_code == 1 and len(rows) == len(tf_values(RUN / "ckpt-4"))
    assert {r["status"] for r in rows} == {"changed", "equal"}
    table = invoke(RUN / "ckpt-4", RUN / "ckpt-8").stdout.splitlines()
    assert table[-1].startswith("23 of 26 variables differ: 23 changed")
    assert "layers:" in table and any(line.startswith("head ") and "2/2" in line for line in table)


def test_exit_codes_and_errors(tmp_path):
    same = invoke(RUN / "ckpt-8", RUN / "ckpt-8")
    assert same.exit_code == 0 and same.stdout.splitlines()[-1] == "all 26 variables equal (atol=0, rtol=0)"
    missing = tmp_path / "nope"
    for args, message in [
        ((RUN / "ckpt-8", missing), f"Error: {missing}: no such file"),
        ((RUN / "ckpt-8", RUN / "ckpt-4", "--map", "(=x"), "Error: bad --map regex '('"),
        ((RUN / "ckpt-8", RUN / "ckpt-4", "--map", "noequals"), "Error: bad --map rule 'noequals'"),
        ((RUN / "ckpt-8", RUN / "ckpt-4", "--atol", "-1"), "Error: atol must be a finite number >= 0"),
        ((RUN / "ckpt-8", RUN / "ckpt-4", "--role", "weights"), "Error: unknown role 'weights'"),
    ]:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
        assert result.stdout == ""


# -- real-world checkpoints -----------------------------------------------------------------------
def test_realworld_empty_prefix_pair(realworld):
    from tensorflow.python.training import py_checkpoint_reader

    folder = realworld / "broken" / "tf1-empty-prefix"
    empty = py_checkpoint_reader.NewCheckpointReader(str(folder) + "/")
    named = tf.train.load_checkpoint(str(folder / "model.ckpt"))
    keys = set(empty.get_variable_to_shape_map())
    assert keys == set(named.get_variable_to_shape_map())
    differ = {k for k in keys if not np.array_equal(empty.get_tensor(k), named.get_tensor(k))}
    report = ckptinspect.diff(str(folder / ".index"), str(folder / "model.ckpt"))
    assert {v.key_a for v in report.variables if v.differs} == differ and len(report.variables) == len(keys)
    assert all(v.status == "changed" for v in report.variables if v.differs)


def test_realworld_estimator_steps(realworld):
    folder = realworld / "tf1-estimator-linear-2shard"
    a, b = tf_values(folder / "model.ckpt-0"), tf_values(folder / "model.ckpt-5000")
    report = ckptinspect.diff(folder / "model.ckpt-0", folder / "model.ckpt-5000")
    rows = by_key(report)
    assert set(rows) == set(a)
    for key, row in rows.items():
        assert row.status == ("equal" if np.array_equal(a[key], b[key]) else "changed"), key
        assert row.max_abs_diff == np.max(np.abs(a[key].astype(np.float64) - b[key].astype(np.float64)))
